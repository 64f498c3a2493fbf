//! `--tp N`: N ranks of one model, split by tensor parallelism over MLX's
//! own distributed layer (docs/ARCHITECTURE.md, "Tensor parallelism"): the
//! `ring` backend (TCP between processes, on one machine or across hosts)
//! on the CPU, `nccl` where the runtime has a GPU (`--tp-backend`).
//!
//! The conventions are mlx.launch's, so a rank started by hand or by
//! mlx.launch looks the same: `MLX_RANK` is the rank; for the ring,
//! `MLX_HOSTFILE` a JSON file with one list of `"ip:port"` addresses per
//! rank; for NCCL, `MLX_WORLD_SIZE` and rank 0's rendezvous address in
//! `NCCL_HOST_IP` and `NCCL_PORT`, one GPU per rank (`CUDA_VISIBLE_DEVICES`).
//!
//! - Without `MLX_RANK`, `host … --tp N` is the launcher: it picks free
//!   ports on 127.0.0.1 (and, for NCCL, GPU `i` of `CUDA_VISIBLE_DEVICES`,
//!   or of all, for rank `i`), starts N copies of its own
//!   command line as ranks 0..N-1 (rank 0's output is the command's output;
//!   the others' stdout is dropped and their stderr kept in a file, shown
//!   when that rank fails), and waits. A rank that exits with an
//!   error (or is killed) ends the run: the launcher names it, stops the
//!   other ranks and exits with an error, so a server never hangs on a
//!   collective whose peer is gone. Each rank reads its stdin, a pipe the
//!   launcher holds, and exits when it closes (the launcher is gone).
//! - With `MLX_RANK`, the process is that rank: it joins the group, within
//!   `--tp-timeout` seconds or exits naming the ranks that did not come, and
//!   runs the command as any process does, with the model option
//!   `tensor-parallel=N`.
//!
//! Every rank runs the same command on the same inputs. The collectives
//! leave the logits identical on every rank, so each rank's decisions
//! (sampling with the seed the launcher hands all ranks when none is
//! given) are the same, and every rank issues the same collectives in the
//! same order.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The seed every rank samples with when the command names none.
pub const SEED_ENV: &str = "MLX_ENGINE_TP_SEED";
/// Set by the launcher: the rank's stdin is the launcher's pipe.
const SUPERVISED_ENV: &str = "MLX_ENGINE_TP_SUPERVISED";
/// Set by the launcher: the backend it resolved, which every rank joins.
const BACKEND_ENV: &str = "MLX_ENGINE_TP_BACKEND";

/// MLX's distributed backend the ranks talk over.
#[derive(clap::ValueEnum, Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TpBackend {
    /// `nccl` when the runtime has a GPU and its libmlx has NCCL, else `ring`.
    #[default]
    Auto,
    /// TCP sockets between processes (CPU arrays).
    Ring,
    /// NVIDIA's collectives, one GPU per rank.
    Nccl,
}

impl TpBackend {
    /// `auto` made concrete for a runtime whose device is a GPU (`gpu`) or not.
    fn resolve(self, gpu: bool) -> &'static str {
        match self {
            TpBackend::Ring => "ring",
            TpBackend::Nccl => "nccl",
            TpBackend::Auto => {
                if gpu && mlx_distributed::is_available("nccl") {
                    "nccl"
                } else {
                    "ring"
                }
            }
        }
    }
}

#[derive(clap::Args, Debug, Default, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub struct TpArgs {
    /// Tensor parallelism over N ranks (MLX's ring backend): started here, or
    /// one per host with MLX_RANK and MLX_HOSTFILE set (docs/ARCHITECTURE.md).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp: Option<usize>,
    /// Seconds a rank waits for every other rank to connect (default 60).
    #[arg(long = "tp-timeout")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp_timeout: Option<u64>,
    /// MLX's backend between the ranks: auto (nccl on a GPU, else ring), ring or nccl.
    #[arg(long = "tp-backend", value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp_backend: Option<TpBackend>,
}

impl TpArgs {
    pub fn ranks(&self) -> usize {
        self.tp.unwrap_or(1)
    }
}

/// What this process is under `--tp`.
pub enum Role {
    /// One process, the whole model.
    Alone,
    /// Started the ranks and watched them; this is its exit code.
    Launched(ExitCode),
    /// Rank `rank` of `ranks`, joined.
    Rank { ranks: usize },
}

/// Launches, or joins as the rank `MLX_RANK` names. `check` runs first
/// (the model's refusals of this many ranks, from its config alone), so a
/// refusal comes once, before any rank starts.
pub fn start(tp: &TpArgs, check: impl FnOnce(usize) -> Result<()>) -> Result<Role> {
    let ranks = tp.ranks();
    if ranks == 0 {
        bail!("--tp 0: the number of ranks is 1 or more");
    }
    if ranks == 1 {
        return Ok(Role::Alone);
    }
    check(ranks)?;
    let gpu = host_engine::runtime::default_device() == host_engine::runtime::DeviceKind::Gpu;
    let backend = match std::env::var(BACKEND_ENV) {
        Ok(b) if b == "nccl" => "nccl",
        Ok(_) => "ring",
        Err(_) => tp.tp_backend.unwrap_or_default().resolve(gpu),
    };
    if backend == "ring" && gpu {
        // Measured on an H200: the ring's all_sum inside a decode step
        // aborts MLX's CUDA graph capture (rank 1 dies with SIGABRT).
        bail!("--tp {ranks}: the ring backend does not run on a GPU runtime (MLX's CUDA graphs abort on its collectives); use --tp-backend nccl");
    }
    if !mlx_distributed::is_available(backend) {
        bail!("--tp {ranks}: this MLX runtime has no `{backend}` backend (NCCL needs the CUDA runtime; the ring is in every build)");
    }
    match std::env::var("MLX_RANK") {
        Err(_) => launch(ranks, backend).map(Role::Launched),
        Ok(rank) => {
            let rank: usize = rank.trim().parse().with_context(|| format!("MLX_RANK={rank}: not a rank number"))?;
            if rank >= ranks {
                bail!("MLX_RANK={rank}: --tp {ranks} has ranks 0 to {}", ranks - 1);
            }
            if std::env::var_os(SUPERVISED_ENV).is_some() {
                exit_when_launcher_goes(rank);
            }
            join(rank, ranks, backend, Duration::from_secs(tp.tp_timeout.unwrap_or(60)))?;
            Ok(Role::Rank { ranks })
        }
    }
}

/// The model's refusals of `ranks`, from config.json and the plugins alone.
pub fn check_model(plugins: &std::path::Path, model: &std::path::Path, ranks: usize) -> Result<()> {
    let reg = crate::plugin_registry::registry(plugins)?;
    let options: Vec<(String, String)> = model_option(ranks).into_iter().collect();
    reg.check_over_ranks(model, &options).with_context(|| format!("loading {}", model.display()))
}

/// The model options a rank opens its model with.
pub fn model_option(ranks: usize) -> Option<(String, String)> {
    (ranks > 1).then(|| (plugin_api::caps::TENSOR_PARALLEL_OPTION.to_owned(), ranks.to_string()))
}

/// Whether this process prints the command's results (rank 0, or alone).
pub fn is_rank0() -> bool {
    std::env::var("MLX_RANK").map_or(true, |r| r.trim() == "0")
}

/// The seed the launcher chose for every rank, when the command gave none.
pub fn shared_seed() -> Option<u64> {
    std::env::var(SEED_ENV).ok().and_then(|s| s.parse().ok())
}

/// Where this rank meets the others, as its backend reads it from the
/// environment (for messages), or why it cannot.
fn rendezvous(rank: usize, ranks: usize, backend: &str) -> Result<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if backend == "nccl" {
        return match (var("NCCL_HOST_IP"), var("NCCL_PORT"), var("MLX_WORLD_SIZE")) {
            (Some(ip), Some(port), Some(n)) if n.trim() == ranks.to_string() => Ok(format!("NCCL_HOST_IP:NCCL_PORT {ip}:{port}")),
            _ => bail!("rank {rank} of {ranks}: NCCL needs NCCL_HOST_IP and NCCL_PORT (rank 0's rendezvous address) and MLX_WORLD_SIZE={ranks}"),
        };
    }
    match var("MLX_HOSTFILE") {
        Some(h) => Ok(format!("MLX_HOSTFILE {h}")),
        None => bail!("rank {rank} of {ranks}: MLX_HOSTFILE is not set (a JSON list of [\"ip:port\"] per rank, as mlx.launch writes)"),
    }
}

fn join(rank: usize, ranks: usize, backend: &'static str, timeout: Duration) -> Result<()> {
    let at = rendezvous(rank, ranks, backend)?;
    let (tx, rx) = std::sync::mpsc::channel();
    // MLX's init blocks until every peer has connected, with no timeout of
    // its own on the accepting side: it runs on a thread we can outwait.
    std::thread::spawn(move || {
        let _ = tx.send(mlx_distributed::Group::init(backend, true).map(|g| {
            let size = g.size();
            // The group lives as long as the process: MLX keeps it and
            // model-kit's collectives use it.
            std::mem::forget(g);
            size
        }));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(size)) if size == ranks => Ok(()),
        Ok(Ok(size)) => bail!("rank {rank}: --tp {ranks}, but {at} lists {size} ranks"),
        Ok(Err(e)) => bail!("rank {rank} of {ranks}: joining the {backend} group ({at}): {e}"),
        Err(_) => bail!(
            "rank {rank} of {ranks}: the other ranks did not connect within {} s ({at}); start every rank with the same one",
            timeout.as_secs()
        ),
    }
}

/// The launcher's pipe on stdin closes when the launcher exits, however it
/// exits: the rank follows it rather than wait on a collective forever.
fn exit_when_launcher_goes(rank: usize) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        eprintln!("rank {rank}: the launcher is gone; exiting");
        std::process::exit(1);
    });
}

fn free_ports(n: usize) -> Result<Vec<u16>> {
    // Bound all at once so they differ; released just before the ranks bind
    // them (another process could take one in between: the ranks then fail
    // to join, naming the hostfile).
    let listeners: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

fn launch(ranks: usize, backend: &'static str) -> Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("mlx-engine-tp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rank_env = rendezvous_env(ranks, backend, &dir)?;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let exe = std::env::current_exe().context("locating the host binary")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut children: Vec<Child> = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .envs(rank_env(rank))
            .env("MLX_RANK", rank.to_string())
            .env(BACKEND_ENV, backend)
            .env(SEED_ENV, seed.to_string())
            .env(SUPERVISED_ENV, "1")
            .stdin(Stdio::piped());
        if rank > 0 {
            let log = std::fs::File::create(dir.join(format!("rank-{rank}.log")))?;
            cmd.stdout(Stdio::null()).stderr(log);
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                stop_all(&mut children);
                bail!("starting rank {rank}: {e}");
            }
        }
    }
    let code = watch(&mut children, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    code
}

/// Each rank's environment for meeting the others: the ring's hostfile of
/// free ports on 127.0.0.1, or NCCL's rendezvous port and one GPU per rank.
fn rendezvous_env(
    ranks: usize,
    backend: &str,
    dir: &std::path::Path,
) -> Result<impl Fn(usize) -> Vec<(String, String)>> {
    let mut shared: Vec<(String, String)> = Vec::new();
    let mut gpus: Vec<String> = Vec::new();
    if backend == "nccl" {
        let port = free_ports(1).context("picking the NCCL rendezvous port")?[0];
        gpus = match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) if !v.trim().is_empty() => v.split(',').map(|d| d.trim().to_owned()).collect(),
            _ => (0..ranks).map(|i| i.to_string()).collect(),
        };
        if gpus.len() < ranks {
            bail!("--tp {ranks} over NCCL needs one GPU per rank; CUDA_VISIBLE_DEVICES lists {}", gpus.len());
        }
        shared.extend([
            ("NCCL_HOST_IP".to_owned(), "127.0.0.1".to_owned()),
            ("NCCL_PORT".to_owned(), port.to_string()),
            ("MLX_WORLD_SIZE".to_owned(), ranks.to_string()),
        ]);
    } else {
        let hostfile = dir.join("hostfile.json");
        let ports = free_ports(ranks).context("picking ports for the ranks")?;
        let hosts: Vec<Vec<String>> = ports.iter().map(|p| vec![format!("127.0.0.1:{p}")]).collect();
        std::fs::write(&hostfile, serde_json::to_string(&hosts)?)
            .with_context(|| format!("writing {}", hostfile.display()))?;
        shared.push(("MLX_HOSTFILE".to_owned(), hostfile.display().to_string()));
    }
    Ok(move |rank: usize| {
        let mut env = shared.clone();
        if let Some(gpu) = gpus.get(rank) {
            env.push(("CUDA_VISIBLE_DEVICES".to_owned(), gpu.clone()));
        }
        env
    })
}

/// Waits for the ranks. All succeed: success. One fails: every rank that
/// has exited by then is named (a rank killed from outside, and the peer
/// that lost it, may end together), the others are stopped, and the run
/// fails. After rank 0 succeeds the others have a grace period to finish
/// the same work.
fn watch(children: &mut [Child], dir: &std::path::Path) -> Result<ExitCode> {
    let mut done: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    let mut rank0_done: Option<Instant> = None;
    loop {
        let mut failed = false;
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank].is_none() {
                done[rank] = child.try_wait()?;
            }
            failed |= done[rank].is_some_and(|s| !s.success());
        }
        if failed {
            // Rank 0's stderr is the command's; the others' logs are shown
            // when rank 0 has not already said why.
            let rank0_failed = done[0].is_some_and(|s| !s.success());
            for (rank, status) in done.iter().enumerate() {
                let Some(status) = status.filter(|s| !s.success()) else { continue };
                if rank > 0 && !rank0_failed {
                    let log = std::fs::read_to_string(dir.join(format!("rank-{rank}.log"))).unwrap_or_default();
                    eprint!("{log}");
                }
                eprintln!("--tp: rank {rank} exited ({status})");
            }
            eprintln!("--tp: stopping the other ranks");
            stop_all(children);
            return Ok(ExitCode::FAILURE);
        }
        if done[0].is_some() {
            rank0_done.get_or_insert_with(Instant::now);
        }
        if done.iter().all(Option::is_some) {
            return Ok(ExitCode::SUCCESS);
        }
        if rank0_done.is_some_and(|t| t.elapsed() > Duration::from_secs(30)) {
            eprintln!("--tp: rank 0 finished but other ranks did not within 30 s; stopping them");
            stop_all(children);
            return Ok(ExitCode::FAILURE);
        }
        // The launcher only watches; 50 ms is its reaction time to a dead rank.
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
    }
    for c in children.iter_mut() {
        let _ = c.wait();
    }
}
