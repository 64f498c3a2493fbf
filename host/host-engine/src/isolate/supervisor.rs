//! Starts the engine child, reads what it says, and starts another when it
//! dies: at once after a child that ran a while, with a doubling back-off
//! (up to 30 s) while children keep dying young. The first child must load
//! the model: if it dies before it says hello, serving fails with its exit.

use super::remote::Remote;
use super::wire::{read_message, FromEngine, Hello};
use std::io::{self, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child that ran this long before it died is not "dying young".
const HEALTHY_RUN: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a starting child is checked for an early exit.
const START_POLL: Duration = Duration::from_millis(20);

/// What `/health` and `/metrics` say about the engine child.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineHealth {
    /// `running`, `starting` (a new child is loading the model) or `backing_off`.
    pub state: &'static str,
    pub pid: Option<u32>,
    pub restarts: u64,
    /// How the last child ended (`signal 9`, `exit code 101`), when one has.
    pub last_exit: Option<String>,
    /// Children that died young in a row (the back-off doubles with each).
    pub consecutive_failures: u32,
    /// Seconds until the next child starts, while backing off.
    pub next_start_in_s: Option<f64>,
    /// The back-off waited before the current (or starting) child, in seconds.
    pub last_backoff_s: f64,
}

/// Makes the command that runs one engine child, given its socket's path.
pub type ChildCommand = Box<dyn Fn(&Path) -> Command + Send>;

pub struct Supervisor {
    health: Arc<Mutex<EngineHealth>>,
    stop: Arc<AtomicBool>,
    wake: Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: PathBuf,
}

impl Supervisor {
    /// Starts the first child and waits for its hello; the supervisor then
    /// keeps a child running until [`Supervisor::shutdown`].
    pub fn start(command: ChildCommand, remote: Arc<Remote>) -> io::Result<(Self, Hello)> {
        let (dir, path, listener) = private_socket()?;
        listener.set_nonblocking(true)?;
        let mut child = command(&path).spawn()?;
        let (hello, stream) = match connect(&listener, &mut child)? {
            Ok(pair) => pair,
            Err(status) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(io::Error::other(format!("the engine process {} before it was ready", describe(status))));
            }
        };
        let health = Arc::new(Mutex::new(EngineHealth {
            state: "running",
            pid: Some(hello.pid),
            restarts: 0,
            last_exit: None,
            consecutive_failures: 0,
            next_start_in_s: None,
            last_backoff_s: 0.0,
        }));
        remote.attach(stream.try_clone()?);
        let stop = Arc::new(AtomicBool::new(false));
        let (wake, woken) = channel();
        let looped = Loop { command, listener, path, remote, health: health.clone(), stop: stop.clone(), woken };
        let thread =
            std::thread::Builder::new().name("engine-supervisor".into()).spawn(move || looped.run(child, stream))?;
        Ok((Self { health, stop, wake, thread: Some(thread), dir }, hello))
    }

    pub fn health(&self) -> EngineHealth {
        self.health.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops restarting; the running child sees its socket close and exits.
    pub fn shutdown(&mut self, remote: &Remote) {
        self.stop.store(true, Ordering::SeqCst);
        remote.detach("the server is shutting down", false);
        let _ = self.wake.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Loop {
    command: ChildCommand,
    listener: UnixListener,
    path: PathBuf,
    remote: Arc<Remote>,
    health: Arc<Mutex<EngineHealth>>,
    stop: Arc<AtomicBool>,
    woken: Receiver<()>,
}

impl Loop {
    fn set(&self, f: impl FnOnce(&mut EngineHealth)) {
        f(&mut self.health.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn run(self, first: Child, stream: UnixStream) {
        let mut running = Some((first, stream, Instant::now()));
        let mut failures = 0u32;
        loop {
            if let Some((mut child, stream, since)) = running.take() {
                let why = self.read_until_gone(stream);
                let _ = child.kill();
                let exit = child.wait().map_or_else(|_| "ended".to_owned(), describe);
                tracing::error!(%exit, %why, "the engine process is gone");
                failures = if since.elapsed() >= HEALTHY_RUN { 0 } else { failures + 1 };
                // Health first: a caller that hears its request failed sees the restart.
                self.set(|h| {
                    h.restarts += 1;
                    h.last_exit = Some(exit.clone());
                    h.consecutive_failures = failures;
                    h.pid = None;
                    h.state = "starting";
                });
                let why = format!("the engine process {exit} while this request ran; a new one is starting");
                self.remote.detach(&why, !self.stop.load(Ordering::SeqCst));
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let delay = match failures {
                0 | 1 => Duration::ZERO,
                n => FIRST_BACKOFF.saturating_mul(1 << (n - 2).min(8)).min(MAX_BACKOFF),
            };
            self.set(|h| h.last_backoff_s = delay.as_secs_f64());
            if !delay.is_zero() {
                self.set(|h| {
                    h.state = "backing_off";
                    h.next_start_in_s = Some(delay.as_secs_f64());
                });
                match self.woken.recv_timeout(delay) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
            }
            self.set(|h| {
                h.state = "starting";
                h.next_start_in_s = None;
            });
            let started = Instant::now();
            let mut child = match (self.command)(&self.path).spawn() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the engine process");
                    failures += 1;
                    continue;
                }
            };
            match connect(&self.listener, &mut child) {
                Ok(Ok((hello, stream))) => match stream.try_clone() {
                    Ok(w) => {
                        tracing::info!(pid = hello.pid, "a new engine process is serving");
                        self.remote.attach(w);
                        self.set(|h| {
                            h.state = "running";
                            h.pid = Some(hello.pid);
                        });
                        running = Some((child, stream, started));
                    }
                    Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        failures += 1;
                    }
                },
                Ok(Err(status)) => {
                    let exit = describe(status);
                    tracing::error!(%exit, "the engine process died while it loaded");
                    failures += 1;
                    self.set(|h| {
                        h.restarts += 1;
                        h.last_exit = Some(exit);
                        h.consecutive_failures = failures;
                    });
                }
                Err(e) => {
                    tracing::error!(error = %e, "the engine process did not connect");
                    let _ = child.kill();
                    let _ = child.wait();
                    failures += 1;
                }
            }
        }
    }

    /// Dispatches the child's messages until its socket closes; why it ended.
    fn read_until_gone(&self, stream: UnixStream) -> String {
        let mut r = BufReader::with_capacity(1 << 16, stream);
        loop {
            match read_message::<FromEngine>(&mut r) {
                Ok(Some(msg)) => self.remote.dispatch(msg),
                Ok(None) => return "its socket closed".into(),
                Err(e) => return format!("its socket failed: {e}"),
            }
        }
    }
}

/// Waits for `child` to connect and say hello, or to exit first (its status).
fn connect(listener: &UnixListener, child: &mut Child) -> io::Result<Result<(Hello, UnixStream), ExitStatus>> {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                let mut r = stream.try_clone()?;
                return match read_message::<FromEngine>(&mut r)? {
                    Some(FromEngine::Hello(h)) => Ok(Ok((*h, stream))),
                    _ => match child.wait() {
                        Ok(status) => Ok(Err(status)),
                        Err(e) => Err(e),
                    },
                };
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait()? {
                    return Ok(Err(status));
                }
                std::thread::sleep(START_POLL);
            }
            Err(e) => return Err(e),
        }
    }
}

/// `signal 9 (SIGKILL)`, `exited with code 101`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

/// The engine's socket, `engine.sock` (0600) in a new directory (0700) under
/// the temp dir: only this user can reach it, whatever the umask.
fn private_socket() -> io::Result<(PathBuf, PathBuf, UnixListener)> {
    let dir = socket_dir()?;
    let path = dir.join("engine.sock");
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok((dir, path, listener))
}

/// A private directory for the socket (only this user can connect).
fn socket_dir() -> io::Result<PathBuf> {
    let base = std::env::temp_dir();
    for n in 0..1000u32 {
        let dir = base.join(format!("mlx-engine-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("no free socket directory"))
}

#[cfg(test)]
mod tests {
    use super::private_socket;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_engine_socket_is_private_to_this_user() {
        let (dir, path, _listener) = private_socket().unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
