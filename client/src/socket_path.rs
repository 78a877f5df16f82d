//! Where the daemon's socket lives: one rule shared by the daemon, the CLI and every
//! client, so that they meet without configuration.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

/// Environment variable that overrides the default socket path.
pub const SOCKET_ENV: &str = "SPARKD_SOCKET";
/// The system daemon's socket (systemd unit, `RuntimeDirectory=sparkd`).
pub const SYSTEM_SOCKET_PATH: &str = "/run/sparkd/sparkd.sock";

/// The socket of the current user's daemon: `$XDG_RUNTIME_DIR/sparkd/sparkd.sock` when
/// `XDG_RUNTIME_DIR` is set, else the system path for root, else
/// `/tmp/sparkd-<uid>/sparkd.sock`.
pub fn default_socket_path() -> PathBuf {
    default_socket_path_for(std::env::var_os("XDG_RUNTIME_DIR"), current_uid())
}

pub fn system_socket_path() -> PathBuf {
    PathBuf::from(SYSTEM_SOCKET_PATH)
}

/// The `--socket` flag if given, then `$SPARKD_SOCKET`, then [`default_socket_path`].
pub fn resolve_socket_path(flag: Option<&Path>) -> PathBuf {
    resolve_socket_path_from(flag, std::env::var_os(SOCKET_ENV), default_socket_path)
}

/// The effective uid of this process.
pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

fn default_socket_path_for(xdg_runtime_dir: Option<OsString>, uid: u32) -> PathBuf {
    // An empty or relative XDG_RUNTIME_DIR is invalid per the XDG spec; ignore it.
    match xdg_runtime_dir.map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("sparkd").join("sparkd.sock"),
        _ if uid == 0 => system_socket_path(),
        _ => PathBuf::from(format!("/tmp/sparkd-{uid}/sparkd.sock")),
    }
}

fn resolve_socket_path_from(
    flag: Option<&Path>,
    env: Option<OsString>,
    default: impl FnOnce() -> PathBuf,
) -> PathBuf {
    if let Some(flag) = flag {
        return flag.to_path_buf();
    }
    match env {
        Some(value) if !value.is_empty() => PathBuf::from(value),
        _ => default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdg_runtime_dir_wins_when_set() {
        let path = default_socket_path_for(Some("/run/user/1000".into()), 1000);
        assert_eq!(path, Path::new("/run/user/1000/sparkd/sparkd.sock"));
        let path = default_socket_path_for(Some("/run/user/0".into()), 0);
        assert_eq!(path, Path::new("/run/user/0/sparkd/sparkd.sock"));
    }

    #[test]
    fn root_without_xdg_uses_the_system_socket() {
        assert_eq!(default_socket_path_for(None, 0), system_socket_path());
    }

    #[test]
    fn users_without_xdg_get_a_per_uid_tmp_dir() {
        assert_eq!(
            default_socket_path_for(None, 1234),
            Path::new("/tmp/sparkd-1234/sparkd.sock")
        );
        assert_eq!(
            default_socket_path_for(Some("relative/dir".into()), 1234),
            Path::new("/tmp/sparkd-1234/sparkd.sock")
        );
        assert_eq!(
            default_socket_path_for(Some("".into()), 1234),
            Path::new("/tmp/sparkd-1234/sparkd.sock")
        );
    }

    #[test]
    fn flag_then_env_then_default() {
        let default = || PathBuf::from("/default.sock");
        let flag = Path::new("/flag.sock");
        assert_eq!(
            resolve_socket_path_from(Some(flag), Some("/env.sock".into()), default),
            flag
        );
        assert_eq!(
            resolve_socket_path_from(None, Some("/env.sock".into()), default),
            Path::new("/env.sock")
        );
        assert_eq!(
            resolve_socket_path_from(None, Some("".into()), default),
            Path::new("/default.sock")
        );
        assert_eq!(
            resolve_socket_path_from(None, None, default),
            Path::new("/default.sock")
        );
    }
}
