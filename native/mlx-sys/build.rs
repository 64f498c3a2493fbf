//! Generates bindings for the mlx-c headers of the shared MLX runtime and links
//! `libmlxc.so` and `libmlx.so` dynamically.
//!
//! The runtime is prepared by `cargo xtask setup` under a cached prefix and
//! exposed at `<repo>/.mlx` (override with `MLX_ENGINE_PREFIX`). Linking it
//! shared is what lets the host and every plugin cdylib use one MLX in one
//! process; see docs/ARCHITECTURE.md.

use std::env;
use std::path::{Path, PathBuf};

fn prefix() -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_ENGINE_PREFIX");
    let prefix = match env::var_os("MLX_ENGINE_PREFIX") {
        Some(p) => PathBuf::from(p),
        None => Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../.mlx"),
    };
    match prefix.canonicalize() {
        Ok(p) => p,
        Err(_) => panic!(
            "the MLX runtime is not set up at {} (run `cargo xtask setup` at the repository root, \
             or point MLX_ENGINE_PREFIX at a prefix with lib/libmlx.so, lib/libmlxc.so and include/)",
            prefix.display()
        ),
    }
}

fn main() {
    let prefix = prefix();
    let include = prefix.join("include");
    let lib = prefix.join("lib");
    for needed in [lib.join("libmlx.so"), lib.join("libmlxc.so"), include.join("mlx/c/mlx.h")] {
        assert!(needed.exists(), "{} is missing: run `cargo xtask setup`", needed.display());
    }

    let header_dir = include.join("mlx/c");
    let mut headers: Vec<PathBuf> = std::fs::read_dir(&header_dir)
        .expect("mlx-c headers")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
        .collect();
    headers.sort();
    for h in &headers {
        println!("cargo:rerun-if-changed={}", h.display());
    }
    println!("cargo:rerun-if-changed={}", lib.join("libmlxc.so").display());

    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .clang_arg(format!("-I{}", include.display()))
            // The libc allocator prototypes collide with std's declarations.
            .blocklist_function("malloc")
            .blocklist_function("realloc")
            // Off ARM the patched half.h types are 16-bit storage; lib.rs gives
            // them the Rust shapes mlx-rs expects.
            .blocklist_type("float16_t")
            .blocklist_type("bfloat16_t")
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new())),
        |b, h| b.header(h.to_string_lossy()),
    );
    let bindings = builder.generate().expect("bindgen over mlx-c headers");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlxc");
    println!("cargo:rustc-link-lib=dylib=mlx");
    // Dependents that link final artifacts can read DEP_MLX_LIB_DIR / DEP_MLX_PREFIX.
    println!("cargo::metadata=lib_dir={}", lib.display());
    println!("cargo::metadata=prefix={}", prefix.display());
}
