//! `host serve --isolate`: the API process starts the engine as a child
//! process of this same binary (`host engine-child`) and keeps one running;
//! the child loads the model as `serve` does and serves the API process over
//! a Unix socket (host_engine::isolate).

use crate::model_load::{load, Served};
use crate::serve_args::{batch, queue, ServeArgs};
use anyhow::{Context, Result};
use host_engine::isolate::{self, Hello, Remote, Supervisor};
use host_engine::stats::Stats;
use host_engine::tokenizer::TextSide;
use host_engine::worker::Worker;
use host_server::state::ModelInfo;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

/// Starts the first engine child (it loads the model) and returns the
/// worker that sends it requests, with what the HTTP layer needs.
pub fn start(a: &ServeArgs, model_dir: &Path) -> Result<(Worker, Served)> {
    let exe = std::env::current_exe().context("locating the host binary")?;
    // The child needs no key: it serves only this process.
    let child_args = ServeArgs { api_key: None, isolate: false, ..serde_json::from_value(serde_json::to_value(a)?)? };
    let json = serde_json::to_string(&child_args)?;
    let command: isolate::ChildCommand = Box::new(move |socket: &Path| {
        let mut c = Command::new(&exe);
        c.arg("engine-child").arg("--socket").arg(socket).arg("--serve-args").arg(&json);
        c
    });
    // The mirror holds the SSD tier's counters when the engine has one.
    let ssd = a.ssd_cache.is_some().then(Arc::default);
    let resume = a.generation_checkpoint.is_some();
    let remote = Arc::new(Remote::new(Arc::new(Stats { ssd, ..Stats::default() }), resume));
    let (supervisor, hello) = Supervisor::start(command, remote.clone()).context("starting the engine process")?;
    eprintln!("engine isolated: process {} serves the model; this process serves HTTP", hello.pid);
    let text = text_side(model_dir, hello.vocab_size)?;
    let served = Served {
        text,
        info: ModelInfo {
            max_context: hello.max_context,
            vocab_size: hello.vocab_size,
            hidden_size: hello.hidden_size,
            embeddings: hello.embeddings.clone(),
        },
        planner: hello.planner,
        memory: hello.memory,
        budget: hello.budget,
    };
    Ok((Worker::isolated(remote, supervisor), served))
}

/// The tokenizer and chat template, read here as the engine reads them.
fn text_side(dir: &Path, vocab: u32) -> Result<Option<Arc<TextSide>>> {
    if !dir.join("tokenizer.json").exists() {
        return Ok(None);
    }
    let (_, config) = host_loader::compose::read_config(dir)?;
    let text = TextSide::load(dir, &config, vocab as usize).with_context(|| format!("loading {}", dir.display()))?;
    Ok(Some(Arc::new(text)))
}

/// `host engine-child`: loads the model, connects to the server's socket,
/// says hello and serves until the server closes the socket.
pub fn engine_child(socket: &PathBuf, serve_args: &str) -> Result<()> {
    let a: ServeArgs = serde_json::from_str(serve_args).context("reading the server's options")?;
    let model_dir = a.model.clone().context("the server's options name no model")?;
    let loaded = load(&a, &model_dir, Instant::now(), 1)?;
    let hello = Hello {
        planner: loaded.engine.planner(batch(&a)),
        memory: loaded.memory,
        budget: loaded.budget,
        max_context: loaded.info.max_context,
        vocab_size: loaded.info.vocab_size,
        hidden_size: loaded.info.hidden_size,
        embeddings: loaded.info.embeddings.clone(),
        ssd: a.ssd_cache.is_some(),
        pid: std::process::id(),
    };
    let stream = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    let text = loaded.engine.text().cloned();
    let worker = Worker::start(loaded.engine, queue(&a), batch(&a), Some((loaded.memory, loaded.budget)));
    isolate::child::serve(stream, hello, worker, text).context("serving the API process")?;
    Ok(())
}
