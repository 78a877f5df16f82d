//! Binding the socket: the parent directory, stale sockets, a second daemon, the file's
//! permissions, and removing the file again when the daemon stops.

use std::{
    fs::{self, DirBuilder, Permissions},
    io,
    os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::net::{UnixListener, UnixStream};

use super::{ServerConfig, ServerError};

/// How long to wait for a daemon that may or may not answer on an existing socket.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A listening socket, ready for [`serve`](super::serve).
#[derive(Debug)]
pub struct Listener {
    inner: UnixListener,
    /// The socket file this process created, removed on drop. `None` for an inherited
    /// listener: whoever created that file (systemd) owns it.
    file: Option<SocketFile>,
}

/// The socket file, identified by inode so that drop never deletes a newer daemon's
/// socket that replaced ours at the same path.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// Binds the configured socket path.
///
/// A socket file nobody answers on is stale and removed; one a daemon answers on is
/// [`ServerError::AlreadyRunning`]. A missing parent directory is created with mode
/// `0755`; an existing one is kept as it is, provided it belongs to this user or root.
pub async fn bind(config: &ServerConfig) -> Result<Listener, ServerError> {
    let path = config.socket_path.as_path();
    prepare_parent_dir(path)?;
    remove_stale_socket(path).await?;

    let inner = UnixListener::bind(path).map_err(|source| {
        if source.kind() == io::ErrorKind::AddrInUse {
            // Another daemon bound it between our probe and our bind.
            ServerError::AlreadyRunning {
                path: path.to_path_buf(),
            }
        } else {
            ServerError::Io {
                action: "bind",
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let metadata = fs::symlink_metadata(path).map_err(ServerError::io("inspect", path))?;
    let listener = Listener {
        inner,
        file: Some(SocketFile {
            path: path.to_path_buf(),
            dev: metadata.dev(),
            ino: metadata.ino(),
        }),
    };
    // Until this chmod the file has the umask's mode; the allow-list (when configured)
    // still applies to anyone who connects in that window.
    fs::set_permissions(path, Permissions::from_mode(config.socket_mode))
        .map_err(ServerError::io("set the permissions of", path))?;
    Ok(listener)
}

impl Listener {
    /// Wraps a socket that is already listening (systemd socket activation). Must be
    /// called inside the tokio runtime. The socket file is left alone on drop.
    pub fn from_std(listener: std::os::unix::net::UnixListener) -> Result<Listener, ServerError> {
        listener
            .set_nonblocking(true)
            .map_err(ServerError::Inherited)?;
        let inner = UnixListener::from_std(listener).map_err(ServerError::Inherited)?;
        Ok(Listener { inner, file: None })
    }

    /// The path of the socket file this listener created, if it did.
    pub fn socket_path(&self) -> Option<&Path> {
        self.file.as_ref().map(|file| file.path.as_path())
    }

    pub(crate) async fn accept(&self) -> io::Result<UnixStream> {
        self.inner.accept().await.map(|(stream, _addr)| stream)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let Some(file) = &self.file else { return };
        match fs::symlink_metadata(&file.path) {
            Ok(meta) if meta.dev() == file.dev && meta.ino() == file.ino => {
                if let Err(err) = fs::remove_file(&file.path) {
                    tracing::warn!(path = %file.path.display(), %err, "could not remove the socket file");
                }
            }
            // Gone already, or replaced by someone else's socket: not ours to remove.
            _ => {}
        }
    }
}

fn prepare_parent_dir(socket: &Path) -> Result<(), ServerError> {
    let Some(dir) = socket.parent().filter(|dir| !dir.as_os_str().is_empty()) else {
        return Ok(()); // a bare file name: the current directory
    };
    match fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(ServerError::Io {
            action: "use as the socket directory",
            path: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        }),
        Ok(meta) => {
            let me = spark_client::current_uid();
            if meta.uid() != me && meta.uid() != 0 {
                return Err(ServerError::UnsafeDirectory {
                    path: dir.to_path_buf(),
                    owner: meta.uid(),
                });
            }
            Ok(())
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(ServerError::io("create the socket directory", dir)),
        Err(source) => Err(ServerError::Io {
            action: "inspect",
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Removes a socket file left behind by a daemon that died; refuses if one answers.
async fn remove_stale_socket(path: &Path) -> Result<(), ServerError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServerError::Io {
                action: "inspect",
                path: path.into(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServerError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
        // A daemon answered, or is alive but too busy to (a full backlog is EAGAIN).
        Ok(Ok(_)) | Err(_) => Err(ServerError::AlreadyRunning {
            path: path.to_path_buf(),
        }),
        Ok(Err(err)) if err.kind() == io::ErrorKind::WouldBlock => {
            Err(ServerError::AlreadyRunning {
                path: path.to_path_buf(),
            })
        }
        Ok(Err(err)) if err.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale socket");
            match fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(source) => Err(ServerError::Io {
                    action: "remove stale socket",
                    path: path.into(),
                    source,
                }),
            }
        }
        Ok(Err(err)) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Ok(Err(source)) => Err(ServerError::Io {
            action: "probe",
            path: path.to_path_buf(),
            source,
        }),
    }
}
