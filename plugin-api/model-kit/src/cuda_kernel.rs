//! A CUDA kernel of our own, compiled and launched by MLX (mlx-c's
//! `mlx_fast_cuda_kernel`): the source is the kernel's body; MLX writes its
//! signature from the input and output names (each input also gets
//! `NAME_shape` and `NAME_strides` when the body reads them, so strided
//! inputs are read in place), compiles it once per set of template
//! arguments and runs it on the stream like any op. Only on the CUDA
//! runtime: callers check `ops::on_gpu` first. While `cuda_capture` records,
//! a kernel is described, not built, and its launches are recorded.

use crate::cuda_capture::{self, Launched};
pub use crate::cuda_source::Template;
use crate::cuda_source::{self, Input};
use crate::ops;
use crate::{error, Array, Dtype, Result};
use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, OnceLock};

/// Where a kernel lives once built: the first use compiles it (or keeps
/// why it could not), every later one reuses it.
pub type Cached = OnceLock<std::result::Result<CudaKernel, String>>;

/// The kernel in `cell`, built by `make` on first use. While launches are
/// recorded, a described kernel of its own each time (leaked: recording is
/// for the compile check), never the one in `cell`.
pub fn cached(cell: &'static Cached, make: impl FnOnce() -> Result<CudaKernel>) -> Result<&'static CudaKernel> {
    if cuda_capture::capturing() {
        return make().map(|k| &*Box::leak(Box::new(k)));
    }
    cell.get_or_init(|| make().map_err(|e| e.to_string())).as_ref().map_err(|e| error(e.clone()))
}

/// One launch: threads in all (`grid`, per axis) and per block, the
/// outputs' shapes and dtypes, the template arguments.
pub struct Launch<'a> {
    pub grid: [i32; 3],
    pub threads: [i32; 3],
    pub outputs: &'a [(&'a [i32], Dtype)],
    pub template: &'a [Template],
}

pub struct CudaKernel {
    /// MLX's kernel; None for one described while launches are recorded.
    raw: Option<mlx_sys::mlx_fast_cuda_kernel>,
    /// The name it was made under, the name MLX knows it by (with a hash
    /// of the body), and what its source is written from.
    label: String,
    name: String,
    inputs: Vec<String>,
    outputs: Vec<String>,
    body: String,
    /// Launch configurations built before, by a hash of what they hold: a
    /// decode step launches the same few shapes in every layer and step,
    /// and building one is a dozen calls into MLX.
    configs: Mutex<HashMap<u64, Config>>,
}

/// Configurations kept per kernel before the cache is emptied (prompts of
/// many lengths would otherwise add one each).
const MAX_CONFIGS: usize = 256;

struct Config(mlx_sys::mlx_fast_cuda_kernel_config);

impl Drop for Config {
    fn drop(&mut self) {
        unsafe { mlx_sys::mlx_fast_cuda_kernel_config_free(self.0) };
    }
}

/// FNV-1a: the same value for the same text in every build.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn launch_key(launch: &Launch) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    launch.grid.hash(&mut h);
    launch.threads.hash(&mut h);
    for (shape, dtype) in launch.outputs {
        shape.hash(&mut h);
        (*dtype as u32).hash(&mut h);
    }
    for t in launch.template {
        match *t {
            Template::Int(n, v) => (0u8, n, v).hash(&mut h),
            Template::Bool(n, v) => (1u8, n, v).hash(&mut h),
        }
    }
    h.finish()
}

// MLX's kernel object is immutable once built; launches may come from any
// thread that runs MLX ops.
unsafe impl Send for CudaKernel {}
unsafe impl Sync for CudaKernel {}

fn strings(names: &[&str]) -> Result<mlx_sys::mlx_vector_string> {
    let v = unsafe { mlx_sys::mlx_vector_string_new() };
    for n in names {
        let c = CString::new(*n).map_err(|_| error("a kernel argument name has a NUL byte"))?;
        unsafe { mlx_sys::mlx_vector_string_append_value(v, c.as_ptr()) };
    }
    Ok(v)
}

impl CudaKernel {
    /// `source` is the body; `inputs` and `outputs` name its arguments.
    /// Inputs are read in place, strided (the body reads `NAME_strides`).
    pub fn new(name: &str, inputs: &[&str], outputs: &[&str], source: &str) -> Result<Self> {
        Self::build(name, inputs, outputs, source, false)
    }

    /// As `new`, but MLX copies any input that is not row-contiguous first
    /// (none is copied that already is), so the body may index flat.
    pub fn new_contiguous(name: &str, inputs: &[&str], outputs: &[&str], source: &str) -> Result<Self> {
        Self::build(name, inputs, outputs, source, true)
    }

    fn build(name: &str, inputs: &[&str], outputs: &[&str], source: &str, contiguous: bool) -> Result<Self> {
        let cstr = |s: &str| CString::new(s).map_err(|_| error("kernel text has a NUL byte"));
        // MLX keeps one compiled kernel per name in the process: every plugin
        // carries its own model-kit, and one built from other sources must
        // not run this one's code under the same name.
        let label = name.to_string();
        let name = format!("{name}_{:016x}", fnv1a(source));
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        let mut kernel = Self {
            raw: None,
            label,
            name,
            inputs: owned(inputs),
            outputs: owned(outputs),
            body: source.to_string(),
            configs: Mutex::new(HashMap::new()),
        };
        if cuda_capture::capturing() {
            return Ok(kernel);
        }
        let (cname, csource, header) = (cstr(&kernel.name)?, cstr(source)?, cstr("")?);
        let (ins, outs) = (strings(inputs)?, strings(outputs)?);
        let raw = unsafe {
            mlx_sys::mlx_fast_cuda_kernel_new(
                cname.as_ptr(),
                ins,
                outs,
                csource.as_ptr(),
                header.as_ptr(),
                contiguous,
                0,
            )
        };
        unsafe {
            mlx_sys::mlx_vector_string_free(ins);
            mlx_sys::mlx_vector_string_free(outs);
        }
        if raw.ctx.is_null() {
            return Err(error("MLX could not make the CUDA kernel"));
        }
        kernel.raw = Some(raw);
        Ok(kernel)
    }

    /// The source MLX compiles for a launch over `inputs`.
    fn launched(&self, inputs: &[&Array], launch: &Launch) -> Launched {
        let function = cuda_source::function_name(&self.name, launch.template);
        let ins: Vec<Input> =
            self.inputs.iter().zip(inputs).map(|(name, a)| Input { name, dtype: a.dtype(), ndim: a.ndim() }).collect();
        let outs: Vec<(&str, Dtype)> =
            self.outputs.iter().zip(launch.outputs).map(|(name, (_, dtype))| (name.as_str(), *dtype)).collect();
        let source = cuda_source::source(&function, &self.body, &ins, &outs, launch.template);
        let input_types = ins.iter().map(|i| cuda_source::cuda_type(i.dtype)).collect::<Vec<_>>().join(",");
        Launched {
            kernel: self.label.clone(),
            function,
            input_types,
            source,
            grid: launch.grid,
            threads: launch.threads,
        }
    }

    /// The kernel over `inputs` (lazily, like any op): its outputs.
    pub fn apply(&self, inputs: &[&Array], launch: &Launch) -> Result<Vec<Array>> {
        let Some(raw) = self.raw else {
            if inputs.len() != self.inputs.len() || launch.outputs.len() != self.outputs.len() {
                return Err(error(format!("kernel {}: arguments do not match its names", self.name)));
            }
            cuda_capture::record(self.launched(inputs, launch));
            return launch.outputs.iter().map(|(shape, dtype)| mlx_rs::ops::zeros_dtype(shape, *dtype)).collect();
        };
        let key = launch_key(launch);
        let mut configs = self.configs.lock().unwrap_or_else(|e| e.into_inner());
        if !configs.contains_key(&key) {
            if configs.len() >= MAX_CONFIGS {
                configs.clear();
            }
            let config = Config(unsafe { mlx_sys::mlx_fast_cuda_kernel_config_new() });
            self.configure(config.0, launch)?;
            configs.insert(key, config);
        }
        let config = configs[&key].0;
        let stream = mlx_rs::Stream::thread_local_or_default();
        ops::vector_call("custom CUDA kernel", inputs, |outs, ins| unsafe {
            mlx_sys::mlx_fast_cuda_kernel_apply(outs, raw, ins, config, stream.as_ptr())
        })
    }

    fn configure(&self, config: mlx_sys::mlx_fast_cuda_kernel_config, launch: &Launch) -> Result<()> {
        let [g1, g2, g3] = launch.grid;
        let [t1, t2, t3] = launch.threads;
        ops::checked("kernel grid", || unsafe { mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, g1, g2, g3) })?;
        ops::checked("kernel threads", || unsafe {
            mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, t1, t2, t3)
        })?;
        for (shape, dtype) in launch.outputs {
            ops::checked("kernel output", || unsafe {
                mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    *dtype as mlx_sys::mlx_dtype,
                )
            })?;
        }
        for t in launch.template {
            let (name, set): (&str, Box<dyn Fn(*const std::os::raw::c_char) -> i32>) = match *t {
                Template::Int(n, v) => (
                    n,
                    Box::new(move |c| unsafe {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(config, c, v)
                    }),
                ),
                Template::Bool(n, v) => (
                    n,
                    Box::new(move |c| unsafe {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_bool(config, c, v)
                    }),
                ),
            };
            let c = CString::new(name).map_err(|_| error("a template name has a NUL byte"))?;
            ops::checked("kernel template", || set(c.as_ptr()))?;
        }
        Ok(())
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        if let Some(raw) = self.raw {
            unsafe { mlx_sys::mlx_fast_cuda_kernel_free(raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_share_a_configuration_only_when_everything_in_it_is_equal() {
        let launch = |n: i32, rows: i32| {
            let shape = [1, n];
            launch_key(&Launch {
                grid: [n * 32, 1, 1],
                threads: [256, 1, 1],
                outputs: &[(&shape, Dtype::Bfloat16)],
                template: &[Template::Int("N0", n), Template::Int("R", rows), Template::Bool("F", true)],
            })
        };
        assert_eq!(launch(4096, 2), launch(4096, 2));
        assert_ne!(launch(4096, 2), launch(4096, 1));
        assert_ne!(launch(4096, 2), launch(1024, 2));
    }

    #[test]
    fn kernel_names_carry_a_hash_of_their_source() {
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a("out[0] = 1;"), fnv1a("out[0] = 2;"));
    }
}
