//! The execution plan: the host's single decision of *how* one request runs.
//!
//! Owns [`resolve_execution`], a pure function of three plain inputs: what the
//! request asks for ([`RequestFacts`]), what the composed model, its cache
//! layouts and its drafter can do ([`Capabilities`], read from plugin tags by
//! [`Capabilities::from_tags`]), and how the server is configured
//! ([`ServerFeatures`]). It returns a [`ResolvedExecution`] that is resolved
//! once, before any work, and never re-resolved; the scheduler and the decode
//! loop only read it. Does not own scheduling, caches or sampling, does no
//! I/O and never touches MLX.
//!
//! Rule order:
//! 1. **Method.** Speculative when a draft is configured and every blocker is
//!    waived by a capability, otherwise autoregressive.
//! 2. **Mechanism.** Continuous unless the server is `--batch 1`, the binding
//!    cannot batch, the chosen method has no grouped executor, or a request
//!    fact needs a batch capability the binding lacks. The method is never
//!    given up to gain batching: a speculative request the group cannot take
//!    runs serial and speculative.
//! 3. **Derived.** Prompt cache, checkpoint and compiled decode follow from
//!    the method and the mechanism, never the other way round.
//!
//! Every fallback appends one human-readable reason, so `reasons` is empty
//! exactly when nothing fell back: speculative iff a draft was configured,
//! continuous (`--batch 1` counts, so a log says why batching is off), and
//! prompt cache, checkpoint and compiled decode on wherever both the server
//! and the binding offer them. Ancestor: mlx-bun ≈0.4 `resolveExecution`,
//! minus its seed and logprobs exclusions (we keep per-row RNG and logprobs).

use plugin_api::caps;
use std::fmt;

use caps::SHARED_CHECKPOINTS;

/// What one request asks for; everything the plan depends on, nothing more.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// A drafter is configured for this request (mounted and not opted out).
    pub has_draft: bool,
    /// The drafter's kind (`mtp`, `ngram`, `two-model`, ...), for reasons.
    pub draft_kind: Option<String>,
    pub wants_logprobs: bool,
    /// A non-default KV storage scheme (`affine4:group=64,start=0`, ...).
    pub kv_quant: Option<String>,
    pub has_grammar: bool,
    /// Repetition/presence/frequency penalties: fine in every mechanism, but
    /// not speculative (a token's penalty needs the tokens before it chosen).
    pub has_penalties: bool,
}

/// What the composed binding (model family + cache layouts + drafter) can do.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The base method id; this host knows only `autoregressive`.
    pub method: String,
    /// Rows of different requests can share one forward.
    pub continuous: bool,
    /// Why `continuous` is false, for the reason (None: a generic phrase).
    pub continuous_blocker: Option<String>,
    /// Method ids that may run inside a batch group.
    pub grouped_methods: Vec<String>,
    pub quantized_batch: bool,
    /// Every layout can export/import its state (prefix cache).
    pub state_io: bool,
    pub checkpoints: bool,
    pub shared_checkpoints: bool,
    pub compiled_decode: bool,
    /// A drafter is mounted and every layout can roll back a rejected draft.
    pub speculative: bool,
    /// Why `speculative` is false, for the reason (None: a generic phrase).
    pub speculative_blocker: Option<String>,
    pub speculative_kv_quant: bool,
}

impl Default for Capabilities {
    /// A family that advertises nothing: autoregressive, serial, no extras.
    fn default() -> Self {
        Self::from_tags(&[], &[], None)
    }
}

impl Capabilities {
    /// Reads the capability tags of the model family, of each cache layout
    /// the request's KV lives in (`(plugin name, tags)`, so reasons can name
    /// the layout) and of the drafter, if one is mounted.
    pub fn from_tags(model: &[&str], layouts: &[(&str, &[&str])], drafter: Option<&[&str]>) -> Self {
        let has = |tags: &[&str], t: &str| tags.contains(&t);
        let lacking = |ok: &dyn Fn(&[&str]) -> bool| layouts.iter().find(|(_, t)| !ok(t)).map(|(n, _)| *n);
        // Batching needs the graph (per-row offsets) and every layout (row ops).
        let continuous_blocker = if !has(model, caps::CONTINUOUS_BATCHING) {
            Some(format!("the model family lacks `{}`", caps::CONTINUOUS_BATCHING))
        } else {
            lacking(&|t| has(t, caps::ROWS)).map(|n| format!("the cache layout `{n}` has no row operations"))
        };
        let mut grouped_methods: Vec<String> =
            model.iter().filter_map(|t| t.strip_prefix(caps::GROUPED_PREFIX)).map(str::to_owned).collect();
        // Continuous batching *is* grouped autoregressive decoding.
        let ar = Method::Autoregressive.as_str();
        if has(model, caps::CONTINUOUS_BATCHING) && !grouped_methods.iter().any(|m| m == ar) {
            grouped_methods.insert(0, ar.to_owned());
        }
        // Rejected drafts are undone by `trim` or a spec-round rollback. The
        // layouts given are those holding this request's KV, in its scheme,
        // so rollback also covers a quantized scheme.
        let rollback = lacking(&|t| has(t, caps::TRIM) || has(t, caps::SPEC_ROUND));
        let speculative_blocker = match drafter {
            None => Some("no drafter is mounted".to_owned()),
            Some(d) if has(d, caps::NEEDS_TARGET) && !has(model, caps::SHARED_EMBEDDINGS) => Some(format!(
                "the drafter borrows the target's embeddings but the model lacks `{}`",
                caps::SHARED_EMBEDDINGS
            )),
            Some(_) => rollback.map(|n| {
                format!("the cache layout `{n}` cannot roll back a rejected draft (no `trim` or `spec-round`)")
            }),
        };
        let state_io = lacking(&|t| has(t, caps::STATE_IO)).is_none();
        Self {
            method: ar.to_owned(),
            continuous: continuous_blocker.is_none(),
            continuous_blocker,
            grouped_methods,
            // A graph that attends through its layouts batches over any
            // scheme whose layouts have row operations (`continuous`).
            // So does one over layouts that hand back plain K/V (`plain-fetch`).
            quantized_batch: has(model, caps::QUANTIZED_KV_BATCH)
                || has(model, caps::LAYOUT_ATTENTION)
                || layouts.iter().any(|(_, t)| has(t, caps::PLAIN_FETCH)),
            state_io,
            // A checkpoint is exported layout state, so it needs `state-io`.
            checkpoints: has(model, caps::CHECKPOINTS) && state_io,
            shared_checkpoints: has(model, SHARED_CHECKPOINTS),
            compiled_decode: has(model, caps::COMPILED_DECODE),
            speculative: speculative_blocker.is_none(),
            speculative_blocker,
            speculative_kv_quant: rollback.is_none(),
        }
    }
}

/// How the server is configured (flags), independent of any request.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerFeatures {
    /// Most rows per batch group; 1 (or 0) = strict serial (`--batch 1`).
    pub batch_limit: usize,
    pub prompt_cache: bool,
    /// Speculation is opt-in per (target, drafter) pair until it wins an A/B.
    pub speculation_enabled: bool,
    pub compiled_decode: bool,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Autoregressive,
    Speculative,
}

impl Method {
    /// The id used in `grouped:<method>` tags.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Autoregressive => "autoregressive",
            Method::Speculative => "speculative",
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Serial,
    Continuous,
}

/// The frozen plan for one request. Only [`resolve_execution`] builds one.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResolvedExecution {
    pub method: Method,
    pub mechanism: Mechanism,
    pub prompt_cache: bool,
    pub checkpoint: bool,
    pub compiled_decode: bool,
    /// One sentence per fallback, in rule order; empty when nothing fell back.
    pub reasons: Vec<String>,
}

impl ResolvedExecution {
    /// One line for logs: `speculative continuous +prompt-cache (reason; ...)`.
    pub fn summary(&self) -> String {
        let mech = if self.mechanism == Mechanism::Serial { "serial" } else { "continuous" };
        let mut s = format!("{} {mech}", self.method.as_str());
        let flags = [
            (self.prompt_cache, " +prompt-cache"),
            (self.checkpoint, " +checkpoint"),
            (self.compiled_decode, " +compiled-decode"),
        ];
        s.extend(flags.iter().filter(|(on, _)| *on).map(|(_, name)| *name));
        if !self.reasons.is_empty() {
            s += &format!(" ({})", self.reasons.join("; "));
        }
        s
    }
}

impl fmt::Display for ResolvedExecution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// Everything a plan depends on besides the request: what the binding can
/// do and what the server offers. Made once by the engine
/// (`Engine::planner`); the HTTP layer keeps a copy to resolve each
/// request's plan before queueing it.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct Planner {
    pub capabilities: Capabilities,
    pub features: ServerFeatures,
    /// The drafter's kind, when one is mounted.
    pub draft_kind: Option<String>,
    /// The KV scheme every request's caches are made in, when not `plain`.
    pub kv_quant: Option<String>,
}

impl Planner {
    /// The facts of a request as resolve_execution sees them.
    pub fn facts(&self, req: &crate::request::GenerateRequest) -> RequestFacts {
        RequestFacts {
            has_draft: self.draft_kind.is_some(),
            draft_kind: self.draft_kind.clone(),
            wants_logprobs: req.logprobs.is_some(),
            has_penalties: req.params.has_penalties(),
            has_grammar: req.constraint.is_some(),
            kv_quant: self.kv_quant.clone(),
        }
    }

    pub fn plan(&self, req: &crate::request::GenerateRequest) -> ResolvedExecution {
        resolve_execution(&self.facts(req), &self.capabilities, &self.features)
    }
}

/// Decides how one request runs. Pure: the same inputs give the same plan.
pub fn resolve_execution(req: &RequestFacts, cap: &Capabilities, srv: &ServerFeatures) -> ResolvedExecution {
    let mut reasons = Vec::new();
    // 0. A base method this host does not know still runs, autoregressively;
    // the reason keeps that visible.
    let base_known = cap.method == Method::Autoregressive.as_str();
    if !base_known {
        reasons.push(format!("autoregressive: the base method `{}` is unknown to this host", cap.method));
    }

    // 1. Method. Each blocker not waived by a capability is one reason.
    let mut method = Method::Autoregressive;
    if req.has_draft && base_known {
        let spec = format!(
            "autoregressive: {}speculation",
            req.draft_kind.as_deref().map(|k| format!("{k} ")).unwrap_or_default()
        );
        let before = reasons.len();
        let blockers = [
            // Doctrine: speculation must be switched on for the pair.
            (!srv.speculation_enabled, "is disabled on this server".to_owned()),
            // No drafter, or a layout that cannot undo a rejected draft.
            (
                !cap.speculative,
                format!(
                    "is unavailable: {}",
                    cap.speculative_blocker.as_deref().unwrap_or("the binding cannot run speculative rounds")
                ),
            ),
            // A penalty depends on every token before it: drafts cannot be
            // verified against penalised logits in one forward. (Logprobs are
            // no blocker: the host reads each emitted token's logprobs off
            // the verify's logits, whatever the family.)
            (req.has_penalties, "disabled for repetition, presence and frequency penalties".to_owned()),
            // Rollback must work in the request's KV scheme.
            (
                req.kv_quant.is_some() && !cap.speculative_kv_quant,
                format!("disabled for KV scheme `{}` (no rollback)", req.kv_quant.as_deref().unwrap_or("")),
            ),
        ];
        reasons.extend(blockers.into_iter().filter(|(on, _)| *on).map(|(_, why)| format!("{spec} {why}")));
        if reasons.len() == before {
            method = Method::Speculative;
        }
    }

    // 2. Mechanism. Seed, logprobs and penalties are deliberately absent: we
    // keep per-row RNG, per-row logprobs and per-row penalty history.
    let before = reasons.len();
    let kv = req.kv_quant.as_deref().unwrap_or("");
    let exclusions = [
        // The operator asked for strict serial execution.
        (srv.batch_limit <= 1, "serial: the server runs one request at a time (`--batch 1`)".to_owned()),
        // The graph or a layout has no row operations.
        (
            !cap.continuous,
            format!(
                "serial: {}",
                cap.continuous_blocker.as_deref().unwrap_or("the model binding has no continuous batching")
            ),
        ),
        // A group runs one method; speculation without `grouped:speculative` stays serial.
        (
            cap.continuous && !cap.grouped_methods.iter().any(|m| m == method.as_str()),
            format!("serial: the {0} method has no grouped executor (no `grouped:{0}`)", method.as_str()),
        ),
        (
            req.kv_quant.is_some() && !cap.quantized_batch,
            format!("serial: KV scheme `{kv}` cannot batch (no `{}`)", caps::QUANTIZED_KV_BATCH),
        ),
    ];
    reasons.extend(exclusions.into_iter().filter(|(on, _)| *on).map(|(_, why)| why));
    let mechanism = if reasons.len() == before { Mechanism::Continuous } else { Mechanism::Serial };

    // 3. Derived fields; for each, the first cause is the reason.
    let ar = method == Method::Autoregressive;
    // The layouts must export state. (Speculative requests keep a reusable
    // state: a round's rollback leaves the caches holding exactly the
    // emitted tokens, serial and batched.)
    let pc_block = [(!cap.state_io, format!("the cache layouts cannot export state (no `{}`)", caps::STATE_IO))];
    let prompt_cache = srv.prompt_cache && first_cause(&pc_block, "no prompt cache", &mut reasons);
    // A checkpoint is a resumable snapshot stored with the prompt cache; a
    // grouped one needs `shared-checkpoints`; grammar state is not part of a
    // snapshot; a resumed run could not report logprobs for skipped tokens.
    let ck_block = [
        (
            mechanism == Mechanism::Continuous && !cap.shared_checkpoints,
            format!("continuous rows cannot be checkpointed (no `{SHARED_CHECKPOINTS}`)"),
        ),
        (req.has_grammar, "grammar state is not part of a checkpoint".to_owned()),
        (req.wants_logprobs, "logprobs of resumed tokens would be lost".to_owned()),
    ];
    let checkpoint = prompt_cache && cap.checkpoints && first_cause(&ck_block, "no checkpoint", &mut reasons);
    // The compiled step is one position per row.
    let cd_block = [(!ar, "speculative rounds verify several positions".to_owned())];
    let compiled_decode =
        srv.compiled_decode && cap.compiled_decode && first_cause(&cd_block, "no compiled decode", &mut reasons);

    ResolvedExecution { method, mechanism, prompt_cache, checkpoint, compiled_decode, reasons }
}

/// True when no cause holds; otherwise records the first as `"{what}: {cause}"`.
fn first_cause(causes: &[(bool, String)], what: &str, reasons: &mut Vec<String>) -> bool {
    match causes.iter().find(|(on, _)| *on) {
        Some((_, why)) => {
            reasons.push(format!("{what}: {why}"));
            false
        }
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &[&str] = &[
        "continuous-batching",
        "hidden-taps",
        "shared-embeddings",
        "grouped:speculative",
        "quantized-kv-batch",
        "checkpoints",
        "shared-checkpoints",
        "compiled-decode",
    ];
    const PLAIN: (&str, &[&str]) = ("kv-plain", &["trim", "spec-round", "state-io", "rows"]);
    const ROTATING: (&str, &[&str]) = ("kv-rotating", &["state-io"]);

    /// A llama-like binding over kv-plain with a mounted drafter.
    fn full() -> Capabilities {
        Capabilities::from_tags(LLAMA, &[PLAIN], Some(&["draft-probabilities"]))
    }
    fn without(tag: &str) -> Capabilities {
        let model: Vec<&str> = LLAMA.iter().copied().filter(|t| *t != tag).collect();
        Capabilities::from_tags(&model, &[PLAIN], Some(&["draft-probabilities"]))
    }
    fn srv() -> ServerFeatures {
        ServerFeatures { batch_limit: 8, prompt_cache: true, speculation_enabled: true, compiled_decode: true }
    }
    fn draft() -> RequestFacts {
        RequestFacts { has_draft: true, ..Default::default() }
    }
    fn q4() -> Option<String> {
        Some("affine4".into())
    }

    #[test]
    fn table() {
        let r = RequestFacts::default;
        let mtp = || RequestFacts { draft_kind: Some("mtp".into()), ..draft() };
        // (facts, capabilities, features, "method mechanism [pc] [ck] [cd]", reason substring; "" = no reasons)
        let cases: Vec<(RequestFacts, Capabilities, ServerFeatures, &str, &str)> = vec![
            (r(), full(), srv(), "ar cont pc ck cd", ""),
            (RequestFacts { has_penalties: true, ..r() }, full(), srv(), "ar cont pc ck cd", ""),
            (RequestFacts { wants_logprobs: true, ..r() }, full(), srv(), "ar cont pc cd", "no checkpoint: logprobs"),
            (draft(), full(), srv(), "spec cont pc ck", "no compiled decode: speculative"),
            (
                RequestFacts { has_penalties: true, ..draft() },
                full(),
                srv(),
                "ar cont pc ck cd",
                "autoregressive: speculation disabled for repetition, presence and frequency penalties",
            ),
            (
                RequestFacts { wants_logprobs: true, ..draft() },
                full(),
                srv(),
                "spec cont pc",
                "no checkpoint: logprobs",
            ),
            (
                draft(),
                full(),
                ServerFeatures { speculation_enabled: false, ..srv() },
                "ar cont pc ck cd",
                "speculation is disabled on this server",
            ),
            (
                draft(),
                Capabilities::from_tags(LLAMA, &[PLAIN], None),
                srv(),
                "ar cont pc ck cd",
                "no drafter is mounted",
            ),
            (
                draft(),
                without("grouped:speculative"),
                srv(),
                "spec serial pc ck",
                "serial: the speculative method has no grouped executor",
            ),
            (RequestFacts { kv_quant: q4(), ..mtp() }, full(), srv(), "spec cont pc ck", "no compiled decode"),
            (
                RequestFacts { kv_quant: q4(), ..mtp() },
                Capabilities { speculative_kv_quant: false, ..full() },
                srv(),
                "ar cont pc ck cd",
                "mtp speculation disabled for KV scheme `affine4`",
            ),
            (
                RequestFacts { kv_quant: q4(), ..r() },
                without("quantized-kv-batch"),
                srv(),
                "ar serial pc ck cd",
                "KV scheme `affine4` cannot batch",
            ),
            (RequestFacts { has_grammar: true, ..r() }, full(), srv(), "ar cont pc cd", "no checkpoint: grammar"),
            (r(), full(), ServerFeatures { batch_limit: 1, ..srv() }, "ar serial pc ck cd", "(`--batch 1`)"),
            (draft(), full(), ServerFeatures { batch_limit: 0, ..srv() }, "spec serial pc ck", "one request at a time"),
            (
                r(),
                Capabilities::from_tags(LLAMA, &[PLAIN, ROTATING], None),
                srv(),
                "ar serial pc ck cd",
                "serial: the cache layout `kv-rotating` has no row operations",
            ),
            (
                draft(),
                Capabilities::from_tags(LLAMA, &[PLAIN, ROTATING], Some(&[])),
                srv(),
                "ar serial pc ck cd",
                "layout `kv-rotating` cannot roll back a rejected draft",
            ),
            (
                r(),
                without("continuous-batching"),
                srv(),
                "ar serial pc ck cd",
                "serial: the model family lacks `continuous-batching`",
            ),
            (draft(), without("shared-embeddings"), srv(), "spec cont pc ck", "no compiled decode"),
            (
                draft(),
                Capabilities::from_tags(&LLAMA[..2], &[PLAIN], Some(&["needs-target"])),
                srv(),
                "ar cont pc",
                "the drafter borrows the target's embeddings",
            ),
            (
                r(),
                without("shared-checkpoints"),
                srv(),
                "ar cont pc cd",
                "no checkpoint: continuous rows cannot be checkpointed",
            ),
            (
                r(),
                without("shared-checkpoints"),
                ServerFeatures { batch_limit: 1, ..srv() },
                "ar serial pc ck cd",
                "`--batch 1`",
            ),
            (r(), full(), ServerFeatures { prompt_cache: false, compiled_decode: false, ..srv() }, "ar cont", ""),
            (
                r(),
                Capabilities::from_tags(LLAMA, &[("kv-plain", &["trim", "rows"])], None),
                srv(),
                "ar cont cd",
                "no prompt cache: the cache layouts cannot export state",
            ),
            (
                r(),
                Capabilities { method: "denoising".into(), ..full() },
                srv(),
                "ar cont pc ck cd",
                "base method `denoising` is unknown",
            ),
        ];
        assert!(cases.len() >= 20);
        for (i, (facts, cap, feat, want, reason)) in cases.iter().enumerate() {
            let got = resolve_execution(facts, cap, feat);
            let w: Vec<&str> = want.split(' ').collect();
            let flags = (w[0] == "spec", w[1] == "cont", w.contains(&"pc"), w.contains(&"ck"), w.contains(&"cd"));
            let seen = (
                got.method == Method::Speculative,
                got.mechanism == Mechanism::Continuous,
                got.prompt_cache,
                got.checkpoint,
                got.compiled_decode,
            );
            assert_eq!(seen, flags, "case {i} ({want}): {got}");
            match *reason {
                "" => assert!(got.reasons.is_empty(), "case {i}: {got}"),
                s => assert!(got.reasons.iter().any(|x| x.contains(s)), "case {i}: no reason contains {s:?}: {got}"),
            }
        }
    }

    /// Over every combination of facts and a spread of bindings and servers:
    /// the plan is deterministic and `reasons` is empty iff nothing fell back.
    #[test]
    fn deterministic_and_reasons_iff_fallback() {
        let bindings = [
            full(),
            without("grouped:speculative"),
            without("shared-checkpoints"),
            Capabilities::default(),
            Capabilities::from_tags(LLAMA, &[PLAIN, ROTATING], Some(&[])),
        ];
        let servers = [
            srv(),
            ServerFeatures::default(),
            ServerFeatures { batch_limit: 1, ..srv() },
            ServerFeatures { prompt_cache: false, ..srv() },
        ];
        for bits in 0u32..32 {
            let b = |k: u32| bits & (1 << k) != 0;
            let facts = RequestFacts {
                has_draft: b(0),
                draft_kind: None,
                wants_logprobs: b(1),
                kv_quant: if b(2) { q4() } else { None },
                has_grammar: b(3),
                has_penalties: b(4),
            };
            for cap in &bindings {
                for feat in &servers {
                    let got = resolve_execution(&facts, cap, feat);
                    assert_eq!(got, resolve_execution(&facts, cap, feat));
                    let clean = (got.method == Method::Speculative) == facts.has_draft
                        && got.mechanism == Mechanism::Continuous
                        && got.prompt_cache == feat.prompt_cache
                        && got.checkpoint == (got.prompt_cache && cap.checkpoints)
                        && got.compiled_decode == (feat.compiled_decode && cap.compiled_decode);
                    assert_eq!(got.reasons.is_empty(), clean, "{facts:?} {feat:?}: {got}");
                }
            }
        }
    }
}
