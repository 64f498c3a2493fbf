//! The CPU time the calling thread has spent, for step and round traces: a
//! GPU step's wall time mixes the host's work with its waits for the device
//! (MLX's eval blocks while too many committed graphs are in flight), and
//! only the thread's own CPU time tells how long the host would take alone.

use std::time::Duration;

/// CPU time consumed by this thread so far (zero where the clock is missing).
pub fn now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; the call writes only it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Milliseconds of this thread's CPU time since `start` (a `now()`).
pub fn ms_since(start: Duration) -> f64 {
    now().saturating_sub(start).as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_advances_the_thread_clock_and_sleeping_does_not() {
        // 50 million dependent multiply-adds take tens of ms of CPU however
        // the thread is scheduled; the clock counts them, and no more than
        // the wall time they took.
        let (t0, wall) = (now(), std::time::Instant::now());
        let mut x = 1u64;
        for _ in 0..50_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
        }
        let (busy, took) = (ms_since(t0), wall.elapsed().as_secs_f64() * 1e3);
        assert!(busy >= 5.0 && busy <= took + 1.0, "work counted {busy} ms in {took} ms of wall time");
        let t1 = now();
        std::thread::sleep(Duration::from_millis(50));
        let slept = ms_since(t1);
        assert!(slept < 5.0, "50 ms asleep counted {slept} ms");
    }
}
