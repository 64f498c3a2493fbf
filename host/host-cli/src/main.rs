//! The `host` binary. Parses the command line and hands each command to the
//! crate that owns it; holds no logic of its own beyond the runtime switch.

mod runtime_switch;

use anyhow::Result;
use clap::{Parser, Subcommand};
use host_engine::runtime;

#[derive(Parser)]
#[command(name = "host", about = "An OpenAI-compatible LLM server on MLX, composed from plugins", disable_version_flag = true)]
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
}

fn main() -> Result<()> {
    runtime_switch::apply()?;
    let cli = Cli::parse();
    let _ = &cli.mlx_lib; // consumed by runtime_switch before parsing
    match cli.command {
        Some(Command::Version) => print_version(),
        Some(Command::Probe { size, dtype, iters }) => probe(size, &dtype, iters)?,
        None if cli.version => print_version(),
        None => {
            use clap::CommandFactory;
            Cli::command().print_help()?;
            println!();
        }
    }
    Ok(())
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
