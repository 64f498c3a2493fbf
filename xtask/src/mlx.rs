//! The shared MLX runtime: libmlx from the `mlx-cpu` wheel, libmlxc built as a
//! shared library from the mlx-c sources that the published `mlx-sys` crate
//! carries, patched for Linux/GCC 12, both installed into one cached prefix
//! that `<repo>/.mlx` points at.
//!
//! The three pins below move together: the wheel's MLX version, the mlx-c
//! version inside that mlx-sys release, and the patch written for that pair.

use crate::system;
use crate::util::{cache_dir, copy_dir, fnv, output, run, step, symlink};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const MLX_VERSION: &str = "0.32.4";
pub const MLX_SYS_VERSION: &str = "0.7.0";
pub const PATCH: &str = "native/mlxc-0.7.0-linux.patch";
/// libmlx's float32 products against weights in one order of sums (`stable_gemm`).
const STABLE_GEMM: &str = "native/stable-gemm/stable_gemm.cpp";
/// Bump when the layout this module produces changes.
const LAYOUT: &str = "5";

/// Prepares (or reuses) the runtime prefix and links `.mlx` to it.
pub fn setup(root: &Path) -> Result<PathBuf> {
    let patch = std::fs::read(root.join(PATCH)).with_context(|| format!("reading {PATCH}"))?;
    let stable_gemm_src = std::fs::read(root.join(STABLE_GEMM)).with_context(|| format!("reading {STABLE_GEMM}"))?;
    let key = fnv(&[MLX_VERSION.as_bytes(), MLX_SYS_VERSION.as_bytes(), &patch, &stable_gemm_src, LAYOUT.as_bytes()]);
    let prefix = cache_dir().join(format!("mlx-{MLX_VERSION}-mlxc-{MLX_SYS_VERSION}-{}", &key[..12]));
    let stamp = prefix.join("READY");
    if stamp.exists() {
        step(format!("MLX runtime cached at {}", prefix.display()));
    } else {
        system::ensure_packages()?;
        build_prefix(root, &prefix)?;
        std::fs::write(&stamp, format!("mlx {MLX_VERSION}\nmlx-c {MLX_SYS_VERSION}\nkey {key}\n"))?;
    }
    symlink(&prefix, &root.join(".mlx"))?;
    step(format!(".mlx -> {}", prefix.display()));
    Ok(prefix)
}

fn build_prefix(root: &Path, prefix: &Path) -> Result<()> {
    let work = cache_dir().join("work");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    if prefix.exists() {
        std::fs::remove_dir_all(prefix)?;
    }
    let lib = prefix.join("lib");
    let include = prefix.join("include");
    std::fs::create_dir_all(&lib)?;

    // 1. libmlx, headers and CMake config from the wheel (a zip; no Python at run time).
    step(format!("downloading mlx-cpu=={MLX_VERSION}"));
    let wheel = download_wheel(&format!("mlx-cpu=={MLX_VERSION}"), &cache_dir().join("downloads"))?;
    let unpacked = work.join("wheel");
    run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&unpacked))?;
    std::fs::copy(unpacked.join("mlx/lib/libmlx.so"), lib.join("libmlx.so"))?;
    for e in std::fs::read_dir(unpacked.join("mlx_cpu.libs"))? {
        let e = e?;
        std::fs::copy(e.path(), lib.join(e.file_name()))?;
    }
    copy_dir(&unpacked.join("mlx/include"), &include)?;
    copy_dir(&unpacked.join("mlx/share"), &prefix.join("share"))?;
    // The wheel's RPATH expects a site-packages layout; everything now sits in lib/.
    run(Command::new("patchelf").args(["--set-rpath", "$ORIGIN"]).arg(lib.join("libmlx.so")))?;
    if relink_openblas(&lib)? {
        stable_gemm(root, &lib)?;
    }

    // 2. mlx-c sources from the published mlx-sys crate, fetched by cargo as a package.
    step(format!("fetching the mlx-c sources of mlx-sys {MLX_SYS_VERSION}"));
    let src = fetch_mlx_c(&work)?;
    let patched = work.join("mlx-c");
    copy_dir(&src, &patched)?;
    step(format!("applying {PATCH}"));
    run(Command::new("patch").args(["-p1", "--quiet", "-d"]).arg(&patched).arg("-i").arg(root.join(PATCH)))?;

    // 3. libmlxc as a SHARED library against the wheel's MLX.
    step("building libmlxc (shared)");
    let build = work.join("build");
    run(Command::new("cmake")
        .arg("-S")
        .arg(&patched)
        .arg("-B")
        .arg(&build)
        .args([
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DMLX_C_USE_SYSTEM_MLX=ON",
            "-DBUILD_SHARED_LIBS=ON",
            "-DMLX_C_BUILD_EXAMPLES=OFF",
        ])
        .arg(format!("-DMLX_DIR={}", prefix.join("share/cmake/MLX").display())))?;
    run(Command::new("cmake").arg("--build").arg(&build))?;
    // Beside libmlx: a binary's RUNPATH does not apply to its libraries' own
    // dependencies, so libmlxc must find libmlx through its own $ORIGIN.
    std::fs::copy(build.join("libmlxc.so"), lib.join("libmlxc.so"))?;
    run(Command::new("patchelf").args(["--set-rpath", "$ORIGIN"]).arg(lib.join("libmlxc.so")))?;
    copy_dir(&patched.join("mlx/c"), &include.join("mlx/c"))?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Downloads one wheel by requirement into `dir` (unless it is there
/// already) and returns its path.
pub fn download_wheel(req: &str, dir: &Path) -> Result<PathBuf> {
    fetch_wheel(req, dir, &[])
}

/// The wheel `name==version` in `dir`, if it has been downloaded.
fn cached_wheel(req: &str, dir: &Path) -> Result<Option<PathBuf>> {
    let (name, version) = req.split_once("==").context("pinned requirement")?;
    let stem = format!("{}-{version}-", name.replace('-', "_"));
    Ok(std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
        let f = p.file_name().unwrap().to_string_lossy().to_string();
        f.starts_with(&stem) && f.ends_with(".whl")
    }))
}

/// `download_wheel` with pip's platform options `platform`.
fn fetch_wheel(req: &str, dir: &Path, platform: &[&str]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    if let Some(w) = cached_wheel(req, dir)? {
        return Ok(w);
    }
    run(Command::new("python3")
        .args(["-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"])
        .args(platform)
        .arg("-d")
        .arg(dir)
        .arg(req))?;
    cached_wheel(req, dir)?.with_context(|| format!("no wheel for {req} in {}", dir.display()))
}

/// The wheel bundles a reference BLAS; Debian's OpenBLAS is ~17x faster for
/// f32 matmul on this kind of CPU. Skipped (and said so) when not installed.
/// Whether libmlx now calls OpenBLAS.
fn relink_openblas(lib: &Path) -> Result<bool> {
    let openblas = Path::new("/usr/lib/x86_64-linux-gnu/libopenblas.so.0");
    if !openblas.exists() {
        step("OpenBLAS not found: keeping the wheel's reference BLAS (slow f32 matmul)");
        return Ok(false);
    }
    let needed = output(Command::new("patchelf").arg("--print-needed").arg(lib.join("libmlx.so")))?;
    let Some(blas) = needed.lines().find(|l| l.starts_with("libblas-")) else {
        step("libmlx has no bundled BLAS dependency; nothing to relink");
        return Ok(false);
    };
    step(format!("relinking libmlx: {blas} -> libopenblas.so.0"));
    run(Command::new("patchelf").args(["--replace-needed", blas, "libopenblas.so.0"]).arg(lib.join("libmlx.so")))?;
    Ok(true)
}

/// Builds libmlx_stable_gemm.so (`STABLE_GEMM`: products against weights
/// stored [N, K] with one order of sums per output whatever the number of
/// rows, without OpenBLAS's packing of the whole weight) and makes it
/// libmlx's first needed library, so that its `cblas_sgemm` is the one
/// libmlx's calls bind to in every process.
fn stable_gemm(root: &Path, lib: &Path) -> Result<()> {
    step("building libmlx_stable_gemm (products against weights in one order of sums)");
    let so = lib.join("libmlx_stable_gemm.so");
    let src = root.join(STABLE_GEMM);
    run(Command::new("g++").args(["-O3", "-shared", "-fPIC", "-fopenmp", "-o"]).arg(&so).arg(src).arg("-ldl"))?;
    run(Command::new("patchelf").args(["--add-needed", "libmlx_stable_gemm.so"]).arg(lib.join("libmlx.so")))?;
    let needed = output(Command::new("patchelf").arg("--print-needed").arg(lib.join("libmlx.so")))?;
    let order: Vec<&str> = needed.lines().collect();
    let at = |name: &str| order.iter().position(|l| l.starts_with(name));
    match (at("libmlx_stable_gemm"), at("libopenblas")) {
        (Some(r), Some(b)) if r < b => Ok(()),
        _ => bail!("libmlx's needed libraries put libmlx_stable_gemm after OpenBLAS: {order:?}"),
    }
}

/// Fetches the published mlx-sys crate with cargo (a package, not a git
/// checkout) and returns the mlx-c folder it carries.
fn fetch_mlx_c(work: &Path) -> Result<PathBuf> {
    let fetch = work.join("fetch");
    std::fs::create_dir_all(fetch.join("src"))?;
    std::fs::write(
        fetch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"mlx-c-source\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nmlx-sys = {{ version = \"={MLX_SYS_VERSION}\", default-features = false }}\n\n[workspace]\n"
        ),
    )?;
    std::fs::write(fetch.join("src/lib.rs"), "")?;
    let manifest = fetch.join("Cargo.toml");
    run(Command::new("cargo").arg("fetch").arg("--manifest-path").arg(&manifest))?;
    let meta =
        output(Command::new("cargo").args(["metadata", "--format-version", "1", "--manifest-path"]).arg(&manifest))?;
    let meta: serde_json::Value = serde_json::from_str(&meta)?;
    let pkg = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "mlx-sys"))
        .context("mlx-sys in cargo metadata")?;
    let dir = Path::new(pkg["manifest_path"].as_str().context("manifest_path")?).parent().unwrap().join("src/mlx-c");
    if !dir.join("CMakeLists.txt").exists() {
        bail!("mlx-sys {MLX_SYS_VERSION} does not carry src/mlx-c at {}", dir.display());
    }
    Ok(dir)
}

/// The `mlx-cuda-13` wheel of the same MLX version, fetched once into the
/// cache (the wheel the device machine runs, and where the kernel compile
/// check finds MLX's device headers).
pub fn cuda_wheel() -> Result<PathBuf> {
    let platform = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_35_x86_64"];
    fetch_wheel(&format!("mlx-cuda-13=={MLX_VERSION}"), &cache_dir().join("downloads-cuda"), &platform)
}

/// Lays out the CUDA runtime for the device machine in two halves (each call
/// there carries at most 64 MiB): `.gpu_a/part_aa`, `.gpu_b/part_ab` plus the
/// libmlxc built here and the small wheels. See docs/benchmarks.md.
pub fn gpu_pack(root: &Path) -> Result<()> {
    let prefix = setup(root)?;
    let wheel = cuda_wheel()?;
    for d in [".gpu_a", ".gpu_b"] {
        let p = root.join(d);
        if p.exists() {
            std::fs::remove_dir_all(&p)?;
        }
        std::fs::create_dir_all(&p)?;
    }
    run(Command::new("split").args(["-b", "44M"]).arg(&wheel).arg(root.join(".gpu_a/part_")))?;
    std::fs::rename(root.join(".gpu_a/part_ab"), root.join(".gpu_b/part_ab"))?;
    std::fs::copy(prefix.join("lib/libmlxc.so"), root.join(".gpu_b/libmlxc.so"))?;
    step("ready: carry .gpu_a in one device call, then .gpu_b (see docs/benchmarks.md)");
    Ok(())
}
