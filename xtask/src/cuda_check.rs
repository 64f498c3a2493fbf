//! The toolchain of the CUDA kernel compile check, which needs no GPU:
//! NVRTC and CUDA's runtime headers from their pip wheels, the CCCL headers
//! MLX's CUDA wheel ships, and MLX's own device headers, which that wheel
//! carries only as text inside libmlx (MLX hands them to NVRTC by name).
//! Laid out once in a cached prefix that `<repo>/.cuda-check` points at;
//! `model_kit::kernel_check` reads that layout.

use crate::mlx::{cuda_wheel, download_wheel, MLX_VERSION};
use crate::util::{cache_dir, copy_dir, run, step, symlink};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// CUDA 13.0's compiler: the release mlx-cuda-13's runtime is built for.
const NVRTC: &str = "nvidia-cuda-nvrtc==13.0.88";
const RUNTIME: &str = "nvidia-cuda-runtime==13.0.96";
/// Bump when the layout this module produces changes.
const LAYOUT: &str = "1";

/// MLX's device headers a custom kernel's source includes (`utils.cuh` and
/// what it includes), each found in libmlx by a line only it has.
const DEVICE_HEADERS: [(&str, &str); 3] =
    [("utils.cuh", "using Shape ="), ("config.h", "#define MAX_NDIM"), ("complex.cuh", "#include <cuda/std/complex>")];

/// Prepares (or reuses) the prefix and links `.cuda-check` to it.
pub fn setup(root: &Path) -> Result<PathBuf> {
    let prefix = cache_dir().join(format!("cuda-check-mlx{MLX_VERSION}-{}-{LAYOUT}", NVRTC.replace("==", "-")));
    if prefix.join("READY").exists() {
        step(format!("CUDA compile check toolchain cached at {}", prefix.display()));
    } else {
        build_prefix(&prefix)?;
        std::fs::write(prefix.join("READY"), format!("mlx {MLX_VERSION}\n{NVRTC}\n{RUNTIME}\n"))?;
    }
    symlink(&prefix, &root.join(".cuda-check"))?;
    step(format!(".cuda-check -> {}", prefix.display()));
    Ok(prefix)
}

fn build_prefix(prefix: &Path) -> Result<()> {
    step("laying out NVRTC, CUDA's headers and MLX's device headers for the kernel compile check");
    if prefix.exists() {
        std::fs::remove_dir_all(prefix)?;
    }
    let work = cache_dir().join("work-cuda-check");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    let downloads = cache_dir().join("downloads-cuda");
    for (req, parts) in [(NVRTC, &["nvidia/cu13/lib/"][..]), (RUNTIME, &["nvidia/cu13/include/"][..])] {
        extract(&download_wheel(req, &downloads)?, &work, parts)?;
    }
    extract(&cuda_wheel()?, &work, &["mlx/include/cccl/", "mlx/lib/libmlx.so"])?;

    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib)?;
    for e in std::fs::read_dir(work.join("nvidia/cu13/lib"))? {
        let p = e?.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("libnvrtc") && !name.contains(".alt.") {
            std::fs::copy(&p, lib.join(&name))?;
        }
    }
    copy_dir(&work.join("nvidia/cu13/include"), &prefix.join("cuda/include"))?;
    copy_dir(&work.join("mlx/include/cccl"), &prefix.join("cccl"))?;
    let device = prefix.join("mlx-device/mlx/backend/cuda/device");
    std::fs::create_dir_all(&device)?;
    let libmlx = std::fs::read(work.join("mlx/lib/libmlx.so"))?;
    for (name, marker) in DEVICE_HEADERS {
        std::fs::write(device.join(name), embedded_header(&libmlx, marker).with_context(|| format!("MLX's {name}"))?)?;
    }
    check_closure(&device)?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Unpacks the members of `wheel` under any of `prefixes` into `dest`.
fn extract(wheel: &Path, dest: &Path, prefixes: &[&str]) -> Result<()> {
    let script = "import sys, zipfile\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  names = [n for n in z.namelist() if n.startswith(tuple(sys.argv[3:]))]\n\
                  assert names, 'nothing under ' + ' '.join(sys.argv[3:])\n\
                  z.extractall(sys.argv[2], names)";
    run(Command::new("python3").args(["-c", script]).arg(wheel).arg(dest).args(prefixes))
}

/// The one header text in libmlx that contains `marker`: MLX embeds each
/// device header as a NUL-terminated string that opens with its copyright
/// line.
fn embedded_header(libmlx: &[u8], marker: &str) -> Result<Vec<u8>> {
    let marker = marker.as_bytes();
    let mut found: Vec<&[u8]> = Vec::new();
    let mut from = 0;
    while let Some(at) = find(&libmlx[from..], marker).map(|i| from + i) {
        let start = libmlx[..at].iter().rposition(|&b| b == 0).map_or(0, |i| i + 1);
        let end = libmlx[at..].iter().position(|&b| b == 0).map_or(libmlx.len(), |i| at + i);
        let text = &libmlx[start..end];
        if text.starts_with(b"// Copyright") && !found.contains(&text) {
            found.push(text);
        }
        from = end;
    }
    match found.as_slice() {
        [one] => Ok(one.to_vec()),
        [] => bail!("no embedded header has `{}`", String::from_utf8_lossy(marker)),
        many => bail!("{} embedded headers have `{}`", many.len(), String::from_utf8_lossy(marker)),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Every MLX device header the extracted ones include is extracted too (a
/// newer MLX that includes another fails here, by name, not in NVRTC).
fn check_closure(device: &Path) -> Result<()> {
    const PREFIX: &str = "#include \"mlx/backend/cuda/device/";
    for (name, _) in DEVICE_HEADERS {
        let text = std::fs::read_to_string(device.join(name))?;
        for line in text.lines().filter_map(|l| l.trim().strip_prefix(PREFIX)) {
            let included = line.trim_end_matches('"');
            if !device.join(included).exists() {
                bail!("MLX's {name} includes {included}, which the compile check does not extract");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embedded_header_is_the_one_string_with_its_marker() {
        let lib = b"\0junk using Shape = no\0// Copyright A\nusing Shape = x;\0// Copyright B\n#define MAX_NDIM 10\0";
        assert_eq!(embedded_header(lib, "using Shape =").unwrap(), b"// Copyright A\nusing Shape = x;");
        assert_eq!(embedded_header(lib, "#define MAX_NDIM").unwrap(), b"// Copyright B\n#define MAX_NDIM 10");
        assert!(embedded_header(lib, "absent").is_err());
        let twice = b"// Copyright A\nm\0// Copyright B\nm\0";
        assert!(embedded_header(twice, "m").is_err());
    }
}
