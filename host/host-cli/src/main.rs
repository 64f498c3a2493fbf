//! The `host` binary. Parses the command line and hands each command to the
//! crate that owns it; holds no logic of its own beyond the runtime switch.

mod bench_cmd;
mod draft_cmd;
mod generate_cmd;
mod isolate_cmd;
mod kl_cmd;
mod kv_cmd;
mod model_load;
mod model_options;
mod plugin_registry;
mod plugins_cmd;
mod random_shape;
mod runtime_switch;
mod serve_args;
mod serve_cmd;
mod tp_launch;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use host_engine::{runtime, DtypeChoice, Engine, EngineConfig, SamplingParams, SpeculationConfig};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "host",
    about = "An OpenAI-compatible LLM server on MLX, composed from plugins",
    disable_version_flag = true
)]
struct Cli {
    /// Print the host, MLX runtime and device, then exit.
    #[arg(long = "version", short = 'V')]
    version: bool,
    /// Use the libmlx in DIR (e.g. the CUDA build) instead of the CPU runtime.
    /// Same as MLX_ENGINE_LIB_DIR; see docs/ARCHITECTURE.md.
    #[arg(long = "mlx-lib", value_name = "DIR", global = true)]
    mlx_lib: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Args)]
struct PluginsDir {
    /// The folder scanned for plugins (sub-folders with a plugin.toml).
    #[arg(long, default_value = "plugins", env = "MLX_ENGINE_PLUGINS")]
    plugins: PathBuf,
}

#[derive(Args)]
struct ModelArgs {
    #[command(flatten)]
    dir: PluginsDir,
    /// The model folder (config.json, weights, tokenizer).
    #[arg(long)]
    model: PathBuf,
    /// Compute dtype: auto (float32 on CPU, the checkpoint's on GPU), native, float32, bfloat16, float16.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Multi-token attention on a GPU: fast (our short-query kernels) or mlx (MLX's sdpa, as mlx-lm: bit-identical to it, slower at new lengths).
    #[arg(long = "gpu-attention")]
    gpu_attention: Option<String>,
    /// An option for the model family plugin, `key=value` (repeatable; docs/plugin-guide.md lists model-kit's).
    #[arg(long = "model-option", value_name = "KEY=VALUE")]
    model_option: Vec<String>,
    #[command(flatten)]
    kv: kv_cmd::KvArgs,
}

#[derive(Args)]
struct PromptArgs {
    /// Raw text prompt.
    #[arg(long)]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Comma-separated token ids.
    #[arg(long = "prompt-ids")]
    prompt_ids: Option<String>,
}

// (Parsed once at start-up: the size of its largest variant costs nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Print the MLX runtime this process loaded.
    Version,
    /// Print the device and a square matmul figure of the loaded runtime.
    Probe {
        /// Matrix size n (n x n by n x n).
        #[arg(long, default_value_t = 2048)]
        size: i32,
        /// float32, bfloat16 or float16.
        #[arg(long, default_value = "bfloat16")]
        dtype: String,
        /// Timed iterations after one warm-up.
        #[arg(long, default_value_t = 5)]
        iters: usize,
    },
    /// List every plugin found, its claims and capabilities, and refusals.
    Plugins {
        #[command(flatten)]
        dir: PluginsDir,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate from one prompt.
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        prompt: PromptArgs,
        #[arg(long = "max-tokens", default_value_t = 256)]
        max_tokens: usize,
        /// Temperature (0 = greedy).
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        #[arg(long = "top-p", default_value_t = 1.0)]
        top_p: f32,
        #[arg(long = "top-k", default_value_t = 0)]
        top_k: u32,
        #[arg(long = "min-p", default_value_t = 0.0)]
        min_p: f32,
        #[arg(long = "repetition-penalty", default_value_t = 1.0)]
        repetition_penalty: f32,
        #[arg(long)]
        seed: Option<u64>,
        /// Do not stop at EOS (generate exactly --max-tokens).
        #[arg(long = "ignore-eos")]
        ignore_eos: bool,
        /// Report logprobs with this many alternatives per token.
        #[arg(long)]
        logprobs: Option<usize>,
        /// Print one JSON object instead of streaming text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        draft: draft_cmd::DraftArgs,
        #[command(flatten)]
        tp: tp_launch::TpArgs,
        /// Run the request once, untimed, before the measured run, with its prompt
        /// cycled to `max_tokens + 16` more tokens: one-time costs (kernel
        /// compilation on a GPU) are paid, but no shape the measured run meets was
        /// seen before (cuDNN builds a graph per key length), as in a server.
        #[arg(long)]
        warmup: bool,
    },
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve_args::ServeArgs),
    /// The engine process of `serve --isolate` (the server starts it; not for use by hand).
    #[command(name = "engine-child", hide = true)]
    EngineChild {
        /// The server's socket to connect to.
        #[arg(long)]
        socket: PathBuf,
        /// The server's options, as JSON.
        #[arg(long = "serve-args")]
        serve_args: String,
    },
    /// Estimate the memory a model needs for a context length, and the largest context that fits.
    Fit {
        #[command(flatten)]
        model: ModelArgs,
        /// Total tokens of one request (prompt + generated).
        #[arg(long)]
        ctx: u64,
        /// The budget to fit into, in GiB (default: 75% of RAM).
        #[arg(long = "memory-budget")]
        memory_budget: Option<f64>,
    },
    /// Throughput at several batch sizes, in process (as mlx_lm.benchmark):
    /// prefill and decode tokens/s, time per step, peak memory, each batch
    /// size timed after one untimed trial of the same shape.
    /// `--model shape:FILE` benchmarks random weights of the shape a shape
    /// file describes (tests/bench/shapes/*.json; made once under the
    /// temporary folder).
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// Prompt tokens of each request (random ids).
        #[arg(long = "prompt-len", default_value_t = 512)]
        prompt_len: usize,
        /// Tokens each request generates (greedy, EOS ignored).
        #[arg(long = "gen-len", default_value_t = 128)]
        gen_len: usize,
        /// Batch sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        batch: Vec<usize>,
        /// Trials per batch size (the median is reported).
        #[arg(long, default_value_t = 3)]
        trials: usize,
        /// Print a JSON list of rows instead of a table.
        #[arg(long)]
        json: bool,
        /// Prompts of different lengths per row (from --prompt-len down to about half of it): a left-padded batch, as a server's.
        #[arg(long)]
        ragged: bool,
        /// MLX's buffer cache limit in GiB (default: `host serve`'s, 32 MiB on the CPU, 1/16 of 75% of the device on a GPU).
        #[arg(long = "mlx-cache-limit")]
        mlx_cache_limit: Option<f64>,
        #[command(flatten)]
        tp: tp_launch::TpArgs,
    },
    /// How far a KV scheme (--kv-quant) moves next-token distributions from plain K/V's over a text: KL divergence per position, as JSON.
    KvKl {
        #[command(flatten)]
        model: ModelArgs,
        /// The text (tokenized as --prompt is).
        #[arg(long = "text-file")]
        text_file: PathBuf,
        /// Tokens of the text compared (its first N).
        #[arg(long, default_value_t = 2048)]
        tokens: usize,
        /// Tokens per forward (the first chunk attends plain K/V in both runs).
        #[arg(long, default_value_t = 64)]
        chunk: usize,
    },
    /// Debugging aid: last-position logits of one full forward, as JSON.
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long = "prompt-ids")]
        prompt_ids: String,
    },
}

/// The engine `generate`, `fit` and `logits` run: no prefix cache.
fn engine(m: &ModelArgs, speculation: Option<SpeculationConfig>) -> Result<Engine> {
    engine_over_ranks(m, speculation, 1)
}

/// `engine`, as this rank's part of a model split over `ranks` (`--tp`).
fn engine_over_ranks(m: &ModelArgs, speculation: Option<SpeculationConfig>, ranks: usize) -> Result<Engine> {
    let reg = plugin_registry::registry(&m.dir.plugins)?;
    for r in &reg.refused {
        eprintln!("plugin refused: {} ({}): {}", r.name.as_deref().unwrap_or("?"), r.dir.display(), r.reason);
    }
    let cfg = EngineConfig {
        dtype: DtypeChoice::parse(&m.dtype)?,
        model_options: model_options::options(m.gpu_attention.as_deref(), &m.model_option)?
            .into_iter()
            .chain(tp_launch::model_option(ranks))
            .collect(),
        speculation,
        kv_scheme: m.kv.scheme()?,
        ..Default::default()
    };
    Engine::load(&reg, &m.model, cfg).with_context(|| format!("loading {}", m.model.display()))
}

fn main() -> Result<ExitCode> {
    runtime_switch::apply()?;
    let _idle = MlxIdleAtExit;
    let cli = Cli::parse();
    let _ = &cli.mlx_lib; // consumed by runtime_switch before parsing
    match cli.command {
        Some(Command::Version) => print_version(),
        Some(Command::Serve(args)) => {
            init_tracing("info");
            return serve_cmd::run(args);
        }
        Some(Command::EngineChild { socket, serve_args }) => {
            init_tracing("info");
            isolate_cmd::engine_child(&socket, &serve_args)?
        }
        Some(Command::Probe { size, dtype, iters }) => probe(size, &dtype, iters)?,
        Some(Command::Plugins { dir, json }) => {
            let reg = plugin_registry::registry(&dir.plugins)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&plugins_cmd::report(&reg))?);
            } else {
                plugins_cmd::print_text(&reg);
            }
            return Ok(plugins_cmd::exit_code(&reg));
        }
        Some(Command::Generate {
            model,
            prompt,
            max_tokens,
            temp,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            seed,
            ignore_eos,
            logprobs,
            json,
            draft,
            tp,
            warmup,
        }) => {
            init_tracing("warn");
            let check = |n| tp_launch::check_model(&model.dir.plugins, &model.model, n);
            let ranks = match tp_launch::start(&tp, check)? {
                tp_launch::Role::Launched(code) => return Ok(code),
                tp_launch::Role::Alone => 1,
                tp_launch::Role::Rank { ranks } => ranks,
            };
            let seed = seed.or_else(tp_launch::shared_seed);
            let engine = engine_over_ranks(&model, draft.config()?, ranks)?;
            if ranks > 1 {
                // The speculation cost rule's verdicts are rank 0's on every rank.
                host_engine::lockstep::enter(host_engine::lockstep::Lockstep::current()?);
            }
            let p = generate_cmd::Prompt { text: prompt.prompt, chat: prompt.chat, ids: prompt.prompt_ids };
            let ids = generate_cmd::prompt_ids(&engine, &p)?;
            let params = SamplingParams {
                temperature: temp,
                top_p,
                top_k,
                min_p,
                repetition_penalty,
                seed,
                ..Default::default()
            };
            if warmup {
                let longer = ids.iter().copied().cycle().take(ids.len() + max_tokens + 16).collect();
                let req = host_engine::GenerateRequest {
                    prompt: longer,
                    max_tokens,
                    params: params.clone(),
                    stop_on_eos: !ignore_eos,
                    logprobs,
                    constraint: None,
                };
                let plan = engine.plan(&req, 1);
                host_engine::serial::generate(&engine, &req, &plan, |_| host_engine::Flow::Continue)?;
            }
            generate_cmd::generate(&engine, ids, max_tokens, params, ignore_eos, logprobs, json)?;
        }
        Some(Command::Fit { model, ctx, memory_budget }) => {
            use host_engine::admission::{default_memory_budget, gib, Budget, MemoryModel};
            let engine = engine(&model, None)?;
            let m = MemoryModel::measure(&engine);
            let budget = Budget {
                memory_bytes: memory_budget.map(serve_args::bytes_of_gib).unwrap_or_else(default_memory_budget),
                kv_bytes: None,
                mlx_cache_bytes: 0,
            };
            let n = m.need(ctx.min(m.prefill_step), ctx);
            println!(
                "model        {} ({} via {}, dtype {})",
                model.model.display(),
                engine.model().model_type,
                engine.model().family_plugin,
                engine.dtype_name()
            );
            println!("weights      {:.3} GiB (measured after load)", gib(m.weights_bytes));
            println!("KV           {} bytes/token x {ctx} tokens = {:.3} GiB", m.kv_bytes_per_token, gib(n.kv));
            println!("transient    {:.3} GiB (one prefill chunk's activations + logits, estimated)", gib(n.transient));
            println!(
                "total        {:.3} GiB of a {:.2} GiB budget: {}",
                gib(m.weights_bytes + n.kv + n.transient),
                gib(budget.memory_bytes),
                if m.refuse(&budget, ctx.min(m.prefill_step), ctx).is_none() { "fits" } else { "does NOT fit" }
            );
            let most = m.max_tokens_that_fit(&budget);
            let ctx_cap = if m.max_context > 0 {
                format!(" (the model's own context is {})", m.max_context)
            } else {
                String::new()
            };
            println!("largest context that fits: {most} tokens{ctx_cap}");
        }
        Some(Command::Bench { model, prompt_len, gen_len, batch, trials, json, ragged, mlx_cache_limit, tp }) => {
            init_tracing("warn");
            // Made before any rank starts, so the ranks find it.
            let model = ModelArgs { model: random_shape::resolve(&model.model)?, ..model };
            let check = |n| tp_launch::check_model(&model.dir.plugins, &model.model, n);
            let ranks = match tp_launch::start(&tp, check)? {
                tp_launch::Role::Launched(code) => return Ok(code),
                tp_launch::Role::Alone => 1,
                tp_launch::Role::Rank { ranks } => ranks,
            };
            let engine = engine_over_ranks(&model, None, ranks)?;
            let mlx_cache_bytes = mlx_cache_limit.map(serve_args::bytes_of_gib);
            let args =
                bench_cmd::BenchArgs { prompt_len, gen_len, batches: batch, trials, json, ragged, mlx_cache_bytes };
            bench_cmd::run(engine, args, ranks)?
        }
        Some(Command::KvKl { model, text_file, tokens, chunk }) => {
            init_tracing("warn");
            let scheme = engine(&model, None)?;
            let plain_args = ModelArgs { kv: kv_cmd::KvArgs::default(), ..model };
            let plain = engine(&plain_args, None)?;
            let text =
                std::fs::read_to_string(&text_file).with_context(|| format!("reading {}", text_file.display()))?;
            let p = generate_cmd::Prompt { text: Some(text), chat: None, ids: None };
            let mut ids = generate_cmd::prompt_ids(&plain, &p)?;
            if ids.len() < tokens {
                anyhow::bail!("{} gives {} tokens, fewer than --tokens {tokens}", text_file.display(), ids.len());
            }
            ids.truncate(tokens);
            let out = kl_cmd::run(&plain, &scheme, kl_cmd::KlArgs { tokens: ids, chunk })?;
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Some(Command::Logits { model, prompt_ids }) => {
            let engine = engine(&model, None)?;
            let p = generate_cmd::Prompt { text: None, chat: None, ids: Some(prompt_ids) };
            let ids = generate_cmd::prompt_ids(&engine, &p)?;
            generate_cmd::logits(&engine, ids)?;
        }
        None if cli.version => print_version(),
        None => {
            use clap::CommandFactory;
            Cli::command().print_help()?;
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Lives for all of `main` and is dropped last, however `main` ends
/// (return, error or panic): waits until every MLX stream has run what was
/// queued on it. MLX never stops its stream threads, while `exit` destroys
/// libmlx's statics (the CPU allocator among them) and then unloads
/// OpenBLAS, whose teardown joins its worker threads. Decoding queues step
/// n+1 before it reads step n, so a request that stops at EOS leaves a whole
/// forward pass running on the stream thread, and a step whose result was
/// read still frees its buffers there afterwards. Without this wait
/// OpenBLAS's teardown waited forever for its worker in 7 of 200 `generate`
/// runs that stopped at EOS (tests/bench/stress_exit.sh), 0 of 100 with it.
struct MlxIdleAtExit;

impl Drop for MlxIdleAtExit {
    fn drop(&mut self) {
        host_engine::runtime::wait_for_streams();
    }
}

/// Logs and traces on stderr, filtered by RUST_LOG (`default` when unset);
/// `RUST_LOG=host_engine=trace` shows each step's and round's timings.
fn init_tracing(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn print_version() {
    println!("host {}", env!("CARGO_PKG_VERSION"));
    let libmlx = runtime::object_of(mlx_sys::mlx_version as *const std::ffi::c_void);
    let core = runtime::mapped_objects("libmlx.so");
    println!("mlx {}", runtime::mlx_version());
    println!("libmlxc {}", libmlx.unwrap_or_else(|| "?".into()));
    println!("libmlx {}", core.join(", "));
    println!("device {}", runtime::device_description());
}

fn probe(size: i32, dtype: &str, iters: usize) -> Result<()> {
    use mlx_rs::Dtype;
    let dt = match dtype {
        "float32" | "f32" => Dtype::Float32,
        "bfloat16" | "bf16" => Dtype::Bfloat16,
        "float16" | "f16" => Dtype::Float16,
        other => anyhow::bail!("unsupported dtype `{other}` (float32, bfloat16, float16)"),
    };
    print_version();
    let f = host_engine::probe::matmul(size, dt, iters).map_err(|e| anyhow::anyhow!("{}", e.what()))?;
    println!(
        "matmul {n}x{n}x{n} {dtype}: {ms:.3} ms/iter over {it} iters = {g:.1} GFLOP/s",
        n = f.size,
        ms = f.seconds_per_iter * 1e3,
        it = f.iters,
        g = f.gflops
    );
    Ok(())
}
