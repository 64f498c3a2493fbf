//! What the `*_on_host` tests share: a C++ program holding a kernel body,
//! compiled by g++ (xtask's system packages; `CXX` names another) and run
//! on this machine's CPU, its output returned.

use std::process::Command;

/// A launch's threads as host threads: `run_blocks(blocks, warps, kern)`
/// runs the blocks one after another, each thread of a block on a host
/// thread of its own with `tl_lane`, `tl_warp` (its warp's shuffle barrier
/// of 32) and `tl_block` (the block's barrier) set, calling
/// `kern(block, thread)`, so `__shfl_xor_sync` and `__syncthreads` meet as
/// on a GPU. Needs `<barrier>`, `<deque>`, `<thread>` and `<vector>`, and a
/// `Dim` with one `unsigned x`.
pub const THREAD_SHIMS: &str = r#"
struct Warp { std::barrier<>* bar; float slot[32]; };
thread_local int tl_lane;
thread_local Warp* tl_warp;
thread_local std::barrier<>* tl_block;
static float __shfl_xor_sync(unsigned, float x, int o) {
    tl_warp->slot[tl_lane] = x;
    tl_warp->bar->arrive_and_wait();
    const float y = tl_warp->slot[tl_lane ^ o];
    tl_warp->bar->arrive_and_wait();
    return y;
}
static void __syncthreads() { tl_block->arrive_and_wait(); }
template <typename F>
void run_blocks(int blocks, int warps, F kern) {
    for (int blk = 0; blk < blocks; ++blk) {
        std::barrier<> block(warps * 32);
        std::deque<std::barrier<>> bars;
        std::vector<Warp> ws(warps);
        for (int w = 0; w < warps; ++w) ws[w].bar = &bars.emplace_back(32);
        std::vector<std::thread> threads;
        for (int t = 0; t < warps * 32; ++t)
            threads.emplace_back([&, t] {
                tl_lane = t & 31;
                tl_warp = &ws[t / 32];
                tl_block = &block;
                kern(Dim{(unsigned)blk}, Dim{(unsigned)t});
            });
        for (auto& th : threads) th.join();
    }
}
"#;

/// Compiles `program` (C++20, with threads) under a folder of its own
/// named after `name`, runs it and returns what it printed, and whether it
/// exited 0. A program that does not compile fails the test, with g++'s
/// messages.
pub fn compile_and_run(name: &str, program: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, bin) = (dir.join("harness.cpp"), dir.join("harness"));
    std::fs::write(&src, program).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", "-o"])
        .arg(&bin)
        .arg(&src)
        .output();
    let built = built.unwrap_or_else(|e| panic!("the C++ compiler `{cxx}` did not start: {e}"));
    let ran = built.status.success().then(|| Command::new(&bin).output().unwrap());
    // Removed before any assertion, so that a failing case leaves no folder behind.
    std::fs::remove_dir_all(&dir).unwrap();
    let ran = ran.unwrap_or_else(|| panic!("the harness did not compile:\n{}", String::from_utf8_lossy(&built.stderr)));
    (ran.status.success(), String::from_utf8_lossy(&ran.stdout).into_owned())
}
