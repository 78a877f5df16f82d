//! Who is connecting (the socket's peer credentials) and whether they may.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use tokio::net::UnixStream;

use super::ServerConfig;
use crate::engine::ClientInfo;

/// The peer's pid, uid and gid as the kernel recorded them at `connect` (SO_PEERCRED).
/// All `None` if the kernel would not say, which an allow-list treats as a stranger.
pub(crate) fn client_info(stream: &UnixStream) -> ClientInfo {
    match stream.peer_cred() {
        Ok(cred) => ClientInfo {
            pid: cred.pid().and_then(|pid| u32::try_from(pid).ok()),
            uid: Some(cred.uid()),
            gid: Some(cred.gid()),
        },
        Err(err) => {
            tracing::warn!(%err, "peer credentials unavailable");
            ClientInfo::default()
        }
    }
}

/// The live allow-list of a running server: checked on every new connection and
/// replaceable at any time (SIGHUP) without touching open connections.
#[derive(Debug, Clone)]
pub struct Access(Arc<RwLock<AllowList>>);

impl Access {
    /// Root, the daemon's own user, and the configured users and groups.
    pub fn for_this_process(config: &ServerConfig) -> Self {
        Self::from_list(AllowList::for_this_process(config))
    }

    pub(crate) fn from_list(list: AllowList) -> Self {
        Self(Arc::new(RwLock::new(list)))
    }

    /// Replaces the configured users and groups; connections already admitted stay.
    pub fn update(&self, allowed_uids: Option<Vec<u32>>, allowed_gids: Option<Vec<u32>>) {
        let mut list = self.0.write().unwrap_or_else(|e| e.into_inner());
        list.uids = allowed_uids.map(|ids| ids.into_iter().collect());
        list.gids = allowed_gids.map(|ids| ids.into_iter().collect());
    }

    pub(crate) fn permits(&self, client: &ClientInfo) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .permits(client)
    }
}

/// The users and groups allowed to connect, from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct AllowList {
    uids: Option<HashSet<u32>>,
    gids: Option<HashSet<u32>>,
    /// Always admitted: root and the daemon's own user, who could take over the process
    /// anyway.
    exempt: Vec<u32>,
}

impl AllowList {
    pub(crate) fn new(config: &ServerConfig, exempt: Vec<u32>) -> Self {
        let set = |list: &Option<Vec<u32>>| list.as_ref().map(|ids| ids.iter().copied().collect());
        Self {
            uids: set(&config.allowed_uids),
            gids: set(&config.allowed_gids),
            exempt,
        }
    }

    /// The allow-list of a daemon running as the current user.
    pub(crate) fn for_this_process(config: &ServerConfig) -> Self {
        Self::new(config, vec![0, spark_client::current_uid()])
    }

    pub(crate) fn permits(&self, client: &ClientInfo) -> bool {
        if self.uids.is_none() && self.gids.is_none() {
            return true;
        }
        let Some(uid) = client.uid else { return false };
        if self.exempt.contains(&uid) {
            return true;
        }
        if self.uids.as_ref().is_some_and(|uids| uids.contains(&uid)) {
            return true;
        }
        let Some(gids) = &self.gids else { return false };
        if client.gid.is_some_and(|gid| gids.contains(&gid)) {
            return true;
        }
        // SO_PEERCRED carries only the primary group, but membership in a group such as
        // `sparkd` is usually supplementary. The pid is the connecting process (a pid
        // reused after it exited belongs to a process that cannot own this socket end
        // unless it inherited it).
        client
            .pid
            .and_then(supplementary_groups)
            .is_some_and(|groups| groups.iter().any(|gid| gids.contains(gid)))
    }
}

fn supplementary_groups(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_groups(&status)
}

/// The `Groups:` line of `/proc/<pid>/status`.
fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))?;
    line.split_whitespace()
        .map(|gid| gid.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(uids: Option<Vec<u32>>, gids: Option<Vec<u32>>) -> AllowList {
        let mut config = ServerConfig::new("/unused");
        config.allowed_uids = uids;
        config.allowed_gids = gids;
        AllowList::new(&config, vec![0, 500])
    }

    fn client(uid: u32, gid: u32) -> ClientInfo {
        // No pid: supplementary groups are not consulted.
        ClientInfo {
            pid: None,
            uid: Some(uid),
            gid: Some(gid),
        }
    }

    #[test]
    fn no_lists_admit_everyone_even_without_credentials() {
        let list = allow(None, None);
        assert!(list.permits(&client(1234, 1234)));
        assert!(list.permits(&ClientInfo::default()));
    }

    #[test]
    fn uid_list_admits_listed_users_root_and_the_daemon_user() {
        let list = allow(Some(vec![1000]), None);
        assert!(list.permits(&client(1000, 1000)));
        assert!(list.permits(&client(0, 0)));
        assert!(list.permits(&client(500, 500)));
        assert!(!list.permits(&client(1001, 1000)));
        assert!(!list.permits(&ClientInfo::default()));
    }

    #[test]
    fn gid_list_admits_by_primary_group() {
        let list = allow(None, Some(vec![42]));
        assert!(list.permits(&client(1000, 42)));
        assert!(!list.permits(&client(1000, 43)));
    }

    #[test]
    fn gid_list_admits_by_supplementary_group_of_this_process() {
        let Some(groups) = supplementary_groups(std::process::id()) else {
            eprintln!("skipping: /proc/self/status unreadable");
            return;
        };
        let Some(&group) = groups.first() else {
            eprintln!("skipping: this process has no supplementary groups");
            return;
        };
        let list = allow(None, Some(vec![group]));
        let me = ClientInfo {
            pid: Some(std::process::id()),
            uid: Some(4321),
            gid: Some(u32::MAX),
        };
        assert!(list.permits(&me));
    }

    #[test]
    fn parses_the_groups_line() {
        let status = "Name:\tx\nUid:\t1\t1\t1\t1\nGroups:\t4 24 27 1000 \nNgid:\t0\n";
        assert_eq!(parse_groups(status), Some(vec![4, 24, 27, 1000]));
        assert_eq!(parse_groups("Groups:\t\n"), Some(vec![]));
        assert_eq!(parse_groups("Name:\tx\n"), None);
        assert_eq!(parse_groups("Groups:\tx\n"), None);
    }
}
