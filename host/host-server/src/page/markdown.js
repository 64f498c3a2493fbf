// A small, safe Markdown renderer for model answers. Safety comes first:
// every character of the source is HTML-escaped before any markup is
// added, so the only tags in the output are the ones written here, and a
// link's address can only be http(s) or mailto. Supported: fenced code
// blocks (``` or ~~~, an unclosed fence runs to the end, as while an answer
// streams), inline code, **bold** / __bold__, *italic* / _italic_, headings,
// flat bullet and numbered lists, block quotes, rules, [links](url) and
// paragraphs (a single newline inside one is kept as a line break).
"use strict";

const Markdown = (() => {
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (s) => s.replace(/[&<>"']/g, (c) => ESC[c]);

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const BULLET = /^ {0,3}[-*+]\s+(.*)$/;
  const NUMBERED = /^ {0,3}(\d{1,9})[.)]\s+(.*)$/;
  const QUOTE = /^ {0,3}>\s?(.*)$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;

  // Inline markup on already-escaped text. Code spans are cut out first
  // (their contents are taken literally), then links, bold and italic.
  function inline(escaped) {
    const spans = [];
    const keep = (html) => "\u0000" + (spans.push(html) - 1) + "\u0000";
    let s = escaped.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, _f, code) => keep("<code>" + code.trim() + "</code>"));
    s = s.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (whole, text, url) => {
      if (!/^(https?:\/\/|mailto:)/i.test(url)) return whole;
      return keep('<a href="' + url + '" target="_blank" rel="noopener noreferrer">' + text + "</a>");
    });
    s = s.replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>");
    s = s.replace(/(^|[^*])\*(?=[^\s*])([^*]*?[^\s*])\*(?!\*)/g, "$1<em>$2</em>");
    s = s.replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>");
    return s.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
  }

  function render(source) {
    const lines = String(source).replace(/\u0000/g, "").replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let para = [];
    let list = null; // { tag: "ul" | "ol", items: [] , start }
    let quote = [];
    const flushPara = () => {
      if (para.length) out.push("<p>" + para.map((l) => inline(escape(l))).join("<br>") + "</p>");
      para = [];
    };
    const flushList = () => {
      if (!list) return;
      const start = list.tag === "ol" && list.start !== 1 ? ' start="' + list.start + '"' : "";
      out.push("<" + list.tag + start + ">" + list.items.map((i) => "<li>" + inline(escape(i)) + "</li>").join("") + "</" + list.tag + ">");
      list = null;
    };
    const flushQuote = () => {
      if (quote.length) out.push("<blockquote>" + quote.map((l) => inline(escape(l))).join("<br>") + "</blockquote>");
      quote = [];
    };
    const flush = () => { flushPara(); flushList(); flushQuote(); };

    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      let m;
      if ((m = FENCE.exec(line))) {
        flush();
        const fence = m[1];
        const lang = m[2];
        const body = [];
        for (i++; i < lines.length; i++) {
          const close = lines[i].trim();
          if (close.startsWith(fence) && /^[`~]+$/.test(close) && close[0] === fence[0]) break;
          body.push(lines[i]);
        }
        const cls = lang ? ' class="language-' + escape(lang) + '"' : "";
        out.push("<pre><code" + cls + ">" + escape(body.join("\n")) + "</code></pre>");
      } else if (!line.trim()) {
        flush();
      } else if ((m = HEADING.exec(line))) {
        flush();
        const n = m[1].length;
        out.push("<h" + n + ">" + inline(escape(m[2])) + "</h" + n + ">");
      } else if (RULE.test(line)) {
        flush();
        out.push("<hr>");
      } else if ((m = BULLET.exec(line)) || (m = NUMBERED.exec(line))) {
        const tag = m.length === 3 ? "ol" : "ul";
        flushPara();
        flushQuote();
        if (list && list.tag !== tag) flushList();
        if (!list) list = { tag, items: [], start: tag === "ol" ? Number(m[1]) : 1 };
        list.items.push(m[m.length - 1]);
      } else if ((m = QUOTE.exec(line))) {
        flushPara();
        flushList();
        quote.push(m[1]);
      } else if (list && /^\s{2,}\S/.test(line)) {
        // A continuation line of the last list item.
        list.items[list.items.length - 1] += " " + line.trim();
      } else {
        flushList();
        flushQuote();
        para.push(line);
      }
    }
    flush();
    return out.join("\n");
  }

  return { render, escape };
})();
