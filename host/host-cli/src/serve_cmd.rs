//! `host serve`: flags (optionally from a TOML file, whose keys are checked
//! against the flags clap knows; flags win), the model loaded
//! (`model_load`), then the HTTP server.

use crate::model_load::{load, stage, Served};
use crate::serve_args::{batch, queue, ServeArgs, ThinkingArg};
use anyhow::{bail, Context, Result};
use clap::Args;
use host_engine::worker::Worker;
use host_server::reasoning::ThinkingDefault;
use host_server::state::ServerConfig;
use host_server::system_rules::SystemRules;
use host_server::SamplingDefaults;
use std::time::Instant;

/// What `--tp` serves: no SSD tier or engine isolation. Checked before any
/// rank starts.
fn check_tp(a: &ServeArgs) -> Result<()> {
    let ranks = a.tp.ranks();
    if ranks <= 1 {
        return Ok(());
    }
    if a.ssd_cache.is_some() {
        bail!("--tp {ranks}: the SSD prefix tier is not served with --tp");
    }
    if a.isolate {
        bail!("--tp {ranks}: engine isolation (--isolate) is not served with --tp");
    }
    Ok(())
}

/// Flags over the file: the file's table, overlaid with every flag given.
fn merge(a: ServeArgs) -> Result<ServeArgs> {
    let Some(path) = a.config.clone() else { return Ok(a) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file: toml::Table = toml::from_str(&text).with_context(|| format!("{}: invalid config", path.display()))?;
    let known: Vec<String> = ServeArgs::augment_args(clap::Command::new("serve"))
        .get_arguments()
        .map(|arg| arg.get_id().as_str().to_owned())
        .filter(|id| id != "config")
        .collect();
    if let Some(unknown) = file.keys().find(|k| !known.contains(k)) {
        bail!("{}: unknown option `{unknown}` (known: {})", path.display(), known.join(", "));
    }
    let mut merged = serde_json::to_value(file)?;
    let flags = serde_json::to_value(&a)?;
    if let (Some(m), serde_json::Value::Object(f)) = (merged.as_object_mut(), flags) {
        m.extend(f);
    }
    let mut out: ServeArgs =
        serde_json::from_value(merged).with_context(|| format!("{}: invalid config", path.display()))?;
    out.config = a.config;
    Ok(out)
}

pub fn run(args: ServeArgs) -> Result<std::process::ExitCode> {
    let a = merge(args)?;
    check_tp(&a)?;
    let check = |n| match &a.model {
        Some(m) => crate::tp_launch::check_model(a.plugins.as_deref().unwrap_or("plugins".as_ref()), m, n),
        None => Ok(()),
    };
    let ranks = match crate::tp_launch::start(&a.tp, check)? {
        crate::tp_launch::Role::Launched(code) => return Ok(code),
        crate::tp_launch::Role::Alone => 1,
        crate::tp_launch::Role::Rank { ranks } => ranks,
    };
    let t0 = Instant::now();
    let Some(model_dir) = a.model.clone() else { bail!("--model DIR is required (or `model` in the --config file)") };
    // Checked before the model loads: a typo fails at once.
    let system_rules = SystemRules::parse(&a.system_prompt_rule).map_err(anyhow::Error::msg)?;
    if let Some(n) = a.generation_checkpoint {
        if n == 0 || !a.isolate || a.ssd_cache.is_none() {
            bail!("--generation-checkpoint N needs N >= 1, --isolate (a generation resumes in a new engine process) and --ssd-cache DIR (where its checkpoints are kept)");
        }
    }
    let cfg = server_config(&a, &model_dir, system_rules);
    let (worker, served) = if a.isolate {
        crate::isolate_cmd::start(&a, &model_dir)?
    } else {
        let loaded = load(&a, &model_dir, t0, ranks)?;
        let lockstep = if ranks > 1 { Some(host_engine::lockstep::Lockstep::current()?) } else { None };
        if let Some(lock) = lockstep.as_ref().filter(|l| l.rank() > 0) {
            // A follower serves nothing: it runs what rank 0's worker runs.
            eprintln!("rank {} of {ranks}: following rank 0", lock.rank());
            let memory = Some((loaded.memory, loaded.budget));
            host_engine::worker::follow(&loaded.engine, cfg.batch, memory, lockstep.unwrap());
            return Ok(std::process::ExitCode::SUCCESS);
        }
        let served = Served {
            text: loaded.engine.text().cloned(),
            planner: loaded.engine.planner(cfg.batch),
            info: loaded.info,
            memory: loaded.memory,
            budget: loaded.budget,
        };
        let worker = match lockstep {
            Some(lock) => {
                let memory = Some((loaded.memory, loaded.budget));
                Worker::start_lockstep(loaded.engine, cfg.queue, cfg.batch, memory, lock)
            }
            None => Worker::start(loaded.engine, cfg.queue, cfg.batch, Some((loaded.memory, loaded.budget))),
        };
        (worker, served)
    };
    stage(4, 4, &format!("ready: serving `{}` on http://{}:{}", cfg.model_id, cfg.host, cfg.port), t0);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let Served { text, info, planner, memory, budget } = served;
    rt.block_on(host_server::serve(cfg, worker, text, info, planner, memory, budget))?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn server_config(a: &ServeArgs, model_dir: &std::path::Path, system_rules: SystemRules) -> ServerConfig {
    let model_id = a.model_id.clone().unwrap_or_else(|| {
        model_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
    });
    ServerConfig {
        host: a.host.clone().unwrap_or_else(|| "127.0.0.1".into()),
        port: a.port.unwrap_or(8080),
        api_key: a.api_key.clone(),
        body_limit: a.body_limit.unwrap_or(4 << 20),
        queue: queue(a),
        default_max_tokens: a.max_tokens.unwrap_or(512),
        batch: batch(a),
        debug_endpoints: a.debug_endpoints,
        sse_keepalive: Some(a.sse_keepalive.unwrap_or(5)).filter(|&s| s > 0).map(std::time::Duration::from_secs),
        read_timeout: Some(a.read_timeout.unwrap_or(30)).filter(|&s| s > 0).map(std::time::Duration::from_secs),
        defaults: SamplingDefaults {
            temperature: a.temp,
            top_p: a.top_p,
            top_k: a.top_k,
            min_p: a.min_p,
            repetition_penalty: a.repetition_penalty,
        },
        model_id,
        responses_ttl: std::time::Duration::from_secs(a.responses_ttl.unwrap_or(3600)),
        responses_store_bytes: (a.responses_store.unwrap_or(64.0).max(0.0) * (1u64 << 20) as f64) as usize,
        thinking: match a.thinking.unwrap_or(ThinkingArg::Template) {
            ThinkingArg::Template => ThinkingDefault::Template,
            ThinkingArg::On => ThinkingDefault::On,
            ThinkingArg::Off => ThinkingDefault::Off,
        },
        preserve_thinking: a.preserve_thinking,
        system_rules,
    }
}
