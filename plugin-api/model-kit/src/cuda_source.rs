//! The CUDA source MLX compiles for one launch of a kernel of ours: MLX
//! writes the `__global__` function around the body (`mlx_fast_cuda_kernel`,
//! MLX's `build_kernel`), so this is the text NVRTC sees on the device. The
//! compile check (`kernel_check`) builds the same text without a GPU.

use crate::Dtype;

/// A template argument of the kernel's body (a compile-time constant).
pub enum Template {
    Int(&'static str, i32),
    Bool(&'static str, bool),
}

/// The header MLX puts before every custom kernel.
const HEADER: &str = "\n#include \"mlx/backend/cuda/device/utils.cuh\"\n\n#include <cooperative_groups.h>\n\n";

/// The C++ type MLX names a dtype by.
pub fn cuda_type(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bool => "bool",
        Dtype::Int8 => "int8_t",
        Dtype::Int16 => "int16_t",
        Dtype::Int32 => "int32_t",
        Dtype::Int64 => "int64_t",
        Dtype::Uint8 => "uint8_t",
        Dtype::Uint16 => "uint16_t",
        Dtype::Uint32 => "uint32_t",
        Dtype::Uint64 => "uint64_t",
        Dtype::Float16 => "__half",
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Float32 => "float",
        Dtype::Float64 => "double",
        Dtype::Complex64 => "mlx::core::cu::complex64_t",
    }
}

/// The function's name: MLX's prefix, the kernel's name, then each
/// template value (MLX compiles one function per distinct name).
pub fn function_name(kernel: &str, template: &[Template]) -> String {
    let mut name = format!("custom_kernel_{kernel}");
    for t in template {
        match *t {
            Template::Int(_, v) => name += &format!("_{v}"),
            Template::Bool(_, v) => name += if v { "_t" } else { "_f" },
        }
    }
    name
}

/// An input as the launch sees it: its name in the body, dtype and rank.
pub struct Input<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub ndim: usize,
}

/// The whole translation unit for `body` launched over `inputs` into
/// `outputs` (names and dtypes) with `template`: each input as `const T*`,
/// followed by its shape, strides or rank where the body reads them (and
/// the input is not a scalar), each output as `T*`, the template values as
/// `constexpr` constants at the top of the body.
pub fn source(
    function: &str,
    body: &str,
    inputs: &[Input],
    outputs: &[(&str, Dtype)],
    template: &[Template],
) -> String {
    let mut s = String::with_capacity(body.len() + 2048);
    s += HEADER;
    s += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n";
    s += &format!("__global__ void {function}(\n");
    for input in inputs {
        s += &format!("    const {}* {},\n", cuda_type(input.dtype), input.name);
        if input.ndim > 0 {
            for (suffix, ty) in [("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")] {
                if body.contains(&format!("{}{suffix}", input.name)) {
                    s += &format!("    const __grid_constant__ {ty} {}{suffix},\n", input.name);
                }
            }
        }
    }
    let last = outputs.len().saturating_sub(1);
    for (i, (name, dtype)) in outputs.iter().enumerate() {
        s += &format!("    {}* {name}{}", cuda_type(*dtype), if i < last { ",\n" } else { ") {\n" });
    }
    if !template.is_empty() {
        for t in template {
            s += &match *t {
                Template::Int(n, v) => format!("  constexpr int {n} = {v};\n"),
                Template::Bool(n, v) => format!("  constexpr bool {n} = {v};\n"),
            };
        }
        s += "\n";
    }
    s += body;
    s += "\n}\n\n} // namespace mlx::core::cu\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_strides_are_parameters_only_where_the_body_reads_them() {
        let body = "out[0] = x[x_strides[0]] + y[0];";
        let inputs =
            [Input { name: "x", dtype: Dtype::Bfloat16, ndim: 2 }, Input { name: "y", dtype: Dtype::Int32, ndim: 1 }];
        let text = source("f", body, &inputs, &[("out", Dtype::Float32)], &[Template::Int("D", 4)]);
        assert!(text.contains("const __nv_bfloat16* x,\n    const __grid_constant__ Strides x_strides,\n"));
        assert!(!text.contains("x_shape") && !text.contains("y_strides"));
        assert!(text.contains("    const int32_t* y,\n    float* out) {\n  constexpr int D = 4;\n"));
    }

    #[test]
    fn the_function_name_carries_each_template_value() {
        let t = [Template::Int("D", 128), Template::Bool("M", true), Template::Bool("N", false)];
        assert_eq!(function_name("k_1", &t), "custom_kernel_k_1_128_t_f");
    }
}
