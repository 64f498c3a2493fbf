"""Drives the web chat page at `/` in a real headless Chromium (selenium +
Debian's chromium and chromium-driver) against live `host serve`s, with the
official openai SDK as the reference for what the API answers.

Usage: page_check.py BASE KEYED_BASE KEY OUT_DIR
  BASE        a server started with --debug-endpoints (http://127.0.0.1:PORT)
  KEYED_BASE  a server started with --api-key KEY
  OUT_DIR     where the screenshots go
Prints ALL OK when every check passes; any failure raises (non-zero exit).
"""
import atexit
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.request

import openai
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

base, keyed_base, key, out_dir = sys.argv[1:5]
os.makedirs(out_dir, exist_ok=True)
client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
WAIT = 180  # seconds: generation on a shared CPU


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what, flush=True)


def http(method, url):
    with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)) as r:
        return json.loads(r.read() or b"null")


def stats():
    return http("GET", base + "/stats")


def wait_stats(what, ready):
    def poll(_):
        return ready(stats())

    try:
        WebDriverWait(None, WAIT, poll_frequency=0.02).until(poll)
    except TimeoutException:
        raise AssertionError(f"waited for {what}: {stats()}")


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="page-check-chromium-")
    for a in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1280,900", f"--user-data-dir={profile}",
    ]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    # Chromium and its driver go away however the script ends.
    atexit.register(shutil.rmtree, profile, ignore_errors=True)
    atexit.register(driver.quit)
    return driver


d = browser()
wait = WebDriverWait(d, WAIT, poll_frequency=0.05)


def shot(name):
    path = os.path.join(out_dir, name)
    check(d.save_screenshot(path), f"screenshot {path}")


def messages(kind=""):
    return d.find_elements(By.CSS_SELECTOR, "#conversation .msg" + kind)


def last_answer():
    """Waits until the last assistant message has finished; returns it."""
    wait.until(lambda _: messages(".assistant") and messages(".assistant")[-1].get_attribute("data-state") != "streaming")
    return messages(".assistant")[-1]


def setting(el_id, value):
    toggle = d.find_element(By.ID, "settings-toggle")
    if toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
    el = d.find_element(By.ID, el_id)
    el.clear()
    el.send_keys(value)


def say(text):
    box = d.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def sdk_answer(history, max_tokens, **kw):
    r = client.chat.completions.create(model="m", messages=history, temperature=0, max_tokens=max_tokens, **kw)
    return r.choices[0].message.content, r.usage


# --- the page and the model's name ---------------------------------------
d.get(base + "/")
check(d.title == "mlx-engine chat", "the page loads")
model = client.models.list().data[0].id
wait.until(lambda _: d.find_element(By.ID, "model-name").get_attribute("data-state") == "ready")
check(d.find_element(By.ID, "model-name").text == model, f"the page shows the served model's name {model!r}")

# --- a streamed answer equal to the API's, with its figures --------------
setting("temperature", "0")
setting("max-tokens", "24")
q1 = "What is the capital of France?"
say(q1)
a = last_answer()
check(a.get_attribute("data-state") == "done", "Enter sent the message and the answer finished")
shown = a.get_attribute("data-raw")
expected, usage = sdk_answer([{"role": "user", "content": q1}], 24)
check(shown == expected, f"the answer shown equals the API's: {shown!r} vs {expected!r}")
html = a.find_element(By.CSS_SELECTOR, ".content").get_attribute("innerHTML")
check(html == d.execute_script("return Markdown.render(arguments[0])", expected), "the answer is rendered as markdown")
check(messages(".user")[-1].text.endswith(q1), "the question is shown")
st = a.find_element(By.CSS_SELECTOR, ".stats")
check(int(st.get_attribute("data-completion-tokens")) == usage.completion_tokens, "completion tokens from usage")
tps = float(st.get_attribute("data-tokens-per-second"))
check(tps > 0 and re.search(r"[\d.]+ tokens/s", st.text), f"tokens/s shown: {st.text!r}")
check(re.search(r"\d+ cached of \d+ prompt tokens", st.text), f"cached tokens shown: {st.text!r}")
first_prompt = usage.prompt_tokens

# A second turn carries the history; its prompt starts with the first turn's.
q2 = "And of Germany?"
say(q2)
a = last_answer()
check(a.get_attribute("data-state") == "done", "the second answer finished")
history = [{"role": "user", "content": q1}, {"role": "assistant", "content": shown}, {"role": "user", "content": q2}]
expected2, _ = sdk_answer(history, 24)
check(a.get_attribute("data-raw") == expected2, "the second turn was sent with the history (same answer as the API's)")
cached = int(a.find_element(By.CSS_SELECTOR, ".stats").get_attribute("data-cached-tokens"))
check(cached >= first_prompt - 1, f"the second turn reads the first from the prefix cache ({cached} cached tokens)")
shot("conversation.png")

# --- Shift+Enter is a new line, not a send -------------------------------
box = d.find_element(By.ID, "input")
count = len(messages())
box.send_keys("line one")
box.send_keys(Keys.SHIFT, Keys.ENTER)
box.send_keys("line two")
check(box.get_attribute("value") == "line one\nline two", "Shift+Enter inserted a newline")
check(len(messages()) == count, "Shift+Enter sent nothing")
box.clear()

# --- new chat forgets the conversation -----------------------------------
d.find_element(By.ID, "new-chat").click()
check(not messages() and d.find_element(By.ID, "empty").is_displayed(), "New chat empties the conversation")
say(q1)
a = last_answer()
check(a.get_attribute("data-raw") == expected, "after New chat the question is sent without the old history")
check(int(a.find_element(By.CSS_SELECTOR, ".stats").get_attribute("data-cached-tokens")) > 0, "the repeat hits the cache")

# --- a model answer with a code block, rendered --------------------------
d.find_element(By.ID, "new-chat").click()
q3 = "Write a Python function that adds two numbers."
setting("max-tokens", "40")
say(q3)
a = last_answer()
code_answer, _ = sdk_answer([{"role": "user", "content": q3}], 40)
check(a.get_attribute("data-raw") == code_answer, "the code answer equals the API's")
blocks = re.findall(r"```(\w*)\n(.*?)\n```", code_answer, re.S)
check(blocks, f"the model answered with a fenced code block: {code_answer!r}")
pres = a.find_elements(By.CSS_SELECTOR, ".content pre > code")
check(len(pres) >= len(blocks), "each fenced block is a <pre><code>")
for (lang, code), el in zip(blocks, pres):
    check(el.get_attribute("textContent") == code, f"code block text kept verbatim: {code!r}")
    if lang:
        check(el.get_attribute("class") == f"language-{lang}", f"code block language {lang}")
shot("code-answer.png")

# --- the renderer on a fixed string: structure, and nothing injected -----
md = (
    "# Title\n\nSome **bold**, *italic* and `x < y` code.\n\n- one\n- two\n\n1. first\n2. second\n\n"
    "```js\nconst a = \"<b>not bold</b>\";\n```\n\n[a link](https://example.org/?a=1&b=2) and "
    "[no](javascript:alert(1)) <img src=x onerror=alert(1)><script>alert(2)</script>\n> quoted"
)
d.execute_script(
    "const el = document.createElement('div'); el.id = 'md-test'; el.className = 'msg assistant';"
    "const c = document.createElement('div'); c.className = 'content markdown'; c.innerHTML = Markdown.render(arguments[0]);"
    "el.appendChild(c); document.getElementById('conversation').appendChild(el); el.scrollIntoView();",
    md,
)
t = d.find_element(By.ID, "md-test")
q = lambda sel: t.find_elements(By.CSS_SELECTOR, sel)  # noqa: E731
check([e.text for e in q("h1")] == ["Title"], "a heading")
check([e.text for e in q("strong")] == ["bold"] and [e.text for e in q("em")] == ["italic"], "bold and italic")
check([e.text for e in q("p > code")] == ["x < y"], "inline code, escaped")
check([e.text for e in q("ul > li")] == ["one", "two"] and [e.text for e in q("ol > li")] == ["first", "second"], "lists")
code = q("pre > code.language-js")
check(len(code) == 1 and code[0].get_attribute("textContent") == 'const a = "<b>not bold</b>";', "a fenced block, verbatim")
check(not q("pre b"), "markup inside code stays text")
links = q("a")
check(len(links) == 1 and links[0].get_attribute("href") == "https://example.org/?a=1&b=2", "only the http(s) link")
check(not q("img") and not q("script"), "raw HTML is shown as text, never made elements")
check("<img src=x onerror=alert(1)>" in t.text, "the raw HTML is visible as text")
check([e.text for e in q("blockquote")] == ["quoted"], "a block quote")
shot("markdown.png")

# --- reasoning: a `delta.reasoning_content` stream shows a Thinking section
# No served model here writes reasoning, so this one answer comes from a
# stream the test hands the page's fetch (the SSE bytes a reasoning server
# sends); every other answer in this script is the real server's.
d.find_element(By.ID, "new-chat").click()
d.execute_script(
    r"""
    const real = window.fetch;
    window.fetch = async (url, init) => {
      window.fetch = real;
      const chunks = [
        {choices: [{index: 0, delta: {role: "assistant", content: ""}}]},
        {choices: [{index: 0, delta: {reasoning_content: "The user greets; "}}]},
        {choices: [{index: 0, delta: {reasoning_content: "answer **briefly**."}}]},
        {choices: [{index: 0, delta: {content: "Hello "}}]},
        {choices: [{index: 0, delta: {content: "there."}, finish_reason: "stop"}]},
        {choices: [], usage: {prompt_tokens: 9, completion_tokens: 12, total_tokens: 21,
                              prompt_tokens_details: {cached_tokens: 4}}},
      ];
      const body = chunks.map((c) => "data: " + JSON.stringify(c) + "\n\n").join("") + ": keep-alive\n\ndata: [DONE]\n\n";
      return new Response(body, {status: 200, headers: {"Content-Type": "text/event-stream"}});
    };
    """
)
say("Hi")
a = last_answer()
think = a.find_element(By.CSS_SELECTOR, "details.thinking")
check(a.get_attribute("data-state") == "done" and think.is_displayed(), "reasoning shows a Thinking section")
check(think.get_attribute("open") is None, "collapsed until opened")
think.find_element(By.TAG_NAME, "summary").click()
body = think.find_element(By.CSS_SELECTOR, ".thinking-body")
check(body.text == "The user greets; answer briefly." and body.find_elements(By.TAG_NAME, "strong"), "its text, rendered")
check(a.get_attribute("data-raw") == "Hello there.", "the answer apart from the reasoning")
check(a.find_element(By.CSS_SELECTOR, ".stats").get_attribute("data-cached-tokens") == "4", "usage read from the stream")
shot("thinking.png")
d.find_element(By.ID, "new-chat").click()
say("Hi")
check(not last_answer().find_element(By.CSS_SELECTOR, "details.thinking").is_displayed(), "no reasoning, no section")

# --- stop: a long generation stopped part-way ----------------------------
d.find_element(By.ID, "new-chat").click()
setting("max-tokens", "2000")
before = stats()["cancelled"]
http("POST", base + "/debug/hold")
q4 = "Tell me a very long story about a dragon."
say(q4)
wait_stats("the request to be queued", lambda s: s["queued"] == 1)
http("POST", base + "/debug/release?steps=8")
wait_stats("eight steps, then held", lambda s: s["active"] == 1 and s["hold"]["parked"])
a = messages(".assistant")[-1]
wait.until(lambda _: (a.get_attribute("data-raw") or "") != "")
check(not d.find_element(By.ID, "stop").get_attribute("disabled"), "Stop is enabled while streaming")
d.find_element(By.ID, "stop").click()
wait.until(lambda _: a.get_attribute("data-state") != "streaming")
partial = a.get_attribute("data-raw")
check(a.get_attribute("data-state") == "stopped" and partial, f"Stop leaves the partial answer {partial!r}")
check("stopped" in a.find_element(By.CSS_SELECTOR, ".stats").text, "the answer is marked stopped")
http("POST", base + "/debug/release")
wait_stats("the stopped request to be cancelled", lambda s: s["cancelled"] == before + 1 and s["active"] == 0)
made = stats()["last_cancelled_tokens"]
check(made < 2000, f"the server stopped generating ({made} tokens)")
prefix, _ = sdk_answer([{"role": "user", "content": q4}], 24)
check(prefix.startswith(partial), f"the partial answer is the API's beginning: {partial!r}")
shot("stopped.png")
setting("max-tokens", "12")
say("Hello")
check(last_answer().get_attribute("data-state") == "done", "the server keeps serving after a stop")

# --- an error is shown, with the server's message ------------------------
d.find_element(By.ID, "new-chat").click()
setting("max-tokens", "100000000")
count = len(messages(".error"))
say("Hi")
a = last_answer()
check(a.get_attribute("data-state") == "error", "a request past the context fails")
try:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=100000000)
    raise AssertionError("the API accepted max_tokens past the context")
except openai.BadRequestError as e:
    api_message = e.body["message"]
shown = a.find_element(By.CSS_SELECTOR, ".error-message").text
check(shown == api_message, f"the error body's message is shown: {shown!r}")
check("400" in a.find_element(By.CSS_SELECTOR, ".role").text, "with its status")
check(len(messages(".error")) == count + 1, "as one error message in the conversation")
shot("error.png")
setting("max-tokens", "12")
say("Hello")
check(last_answer().get_attribute("data-state") == "done", "the page and server go on after an error")

# Nothing failed in the page besides the refused request.
for entry in d.get_log("browser"):
    if entry["level"] == "SEVERE":
        check("status of 400" in entry["message"], f"only the expected 400 in the console: {entry['message']}")

# --- a server with --api-key: the page asks for the key ------------------
d.get(keyed_base + "/")
wait.until(lambda _: d.find_element(By.ID, "model-name").get_attribute("data-state") == "error")
err = messages(".error")[-1].find_element(By.CSS_SELECTOR, ".error-message").text
check("API key" in err and "Settings" in err, f"without the key the 401 is shown: {err!r}")
check(d.find_element(By.ID, "settings").is_displayed(), "and the settings open for the key")
shot("api-key-missing.png")
keyed = openai.OpenAI(base_url=keyed_base + "/v1", api_key=key)
keyed_model = keyed.models.list().data[0].id
field = d.find_element(By.ID, "api-key")
field.send_keys(key)
field.send_keys(Keys.TAB)
wait.until(lambda _: d.find_element(By.ID, "model-name").get_attribute("data-state") == "ready")
check(d.find_element(By.ID, "model-name").text == keyed_model, "with the key the model's name shows")
setting("temperature", "0")
setting("max-tokens", "8")
say("Hi")
a = last_answer()
r = keyed.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=8)
check(a.get_attribute("data-raw") == r.choices[0].message.content, "a keyed server answers the page")
d.refresh()
wait.until(lambda _: d.find_element(By.ID, "model-name").get_attribute("data-state") == "ready")
check(d.find_element(By.ID, "api-key").get_attribute("value") == key, "the key is remembered (localStorage)")
shot("api-key.png")

print("ALL OK")
