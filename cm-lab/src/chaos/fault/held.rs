//! With the webhook backend, one SIGKILL is aimed at a delivery in flight: from a quarter of the
//! way into the run, the fault waits until the receiver holds an answer back (its seeded delays),
//! finds the scheduler whose socket sent that request (`/proc/net/tcp` names the socket's inode,
//! `/proc/PID/fd` its owner), and kills it while the answer is still held. Its claim expires and
//! a later attempt delivers the occurrence again under the same `webhook-id`, so every webhook
//! run tests redelivery instead of leaving it to where the random kills happen to land.

use std::time::{Duration, Instant};

use super::{Chaos, Fault};
use crate::chaos::backend::webhook::HeldAnswers;
use crate::chaos::report::Findings;

/// How much of a held answer must be left for the kill to land before it goes out.
const LEFT: Duration = Duration::from_millis(150);

/// How often the fault looks for a held answer while it waits for one.
const POLL: Duration = Duration::from_millis(10);

pub(in crate::chaos) struct HeldKill {
    held: HeldAnswers,
    receiver_port: u16,
    at: Instant,
    /// After this it gives up (the run's check then says redelivery was not tested).
    give_up: Instant,
    done: bool,
    /// What it killed, for the summary.
    killed: Option<String>,
}

impl HeldKill {
    pub fn new(held: HeldAnswers, receiver_port: u16, start: Instant, duration: Duration) -> Self {
        HeldKill {
            held,
            receiver_port,
            at: start + duration / 4,
            give_up: start + duration * 3 / 4,
            done: false,
            killed: None,
        }
    }
}

impl Fault for HeldKill {
    fn next_at(&self) -> Option<Instant> {
        (!self.done).then_some(self.at)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let now = Instant::now();
        if now >= self.give_up {
            self.done = true;
            return Ok(());
        }
        if now < chaos.quiet_until {
            self.at = chaos.quiet_until;
            return Ok(());
        }
        let slot = self
            .held
            .sender_port(LEFT)
            .and_then(|port| socket_inode(self.receiver_port, port))
            .and_then(|inode| chaos.fleet.slot_holding_socket(inode));
        let Some(slot) = slot else {
            self.at = now + POLL;
            return Ok(());
        };
        let (old, new) = chaos.fleet.kill_and_restart(slot, false)?;
        chaos.say(format!(
            "SIGKILL {old} while the receiver holds its delivery's answer, started {new}"
        ));
        self.killed = Some(old);
        self.done = true;
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::one(
            "held kill",
            match &self.killed {
                Some(id) => format!("{id} SIGKILLed while its delivery's answer was held"),
                None => "no delivery's answer was held while the fault looked".to_string(),
            },
        )
    }
}

/// The inode of the socket from 127.0.0.1:`local` to 127.0.0.1:`remote`, read from
/// `/proc/net/tcp` (and `tcp6`, for a socket of the v4-mapped kind).
fn socket_inode(remote: u16, local: u16) -> Option<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .find_map(|table| find_inode(&table, local, remote))
}

/// In a `/proc/net/tcp` table, the inode of the row whose local port is `local` and remote port
/// is `remote`.
fn find_inode(table: &str, local: u16, remote: u16) -> Option<u64> {
    let port = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (l, r, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        (port(l)? == local && port(r)? == remote)
            .then(|| inode.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inode_is_read_from_the_row_of_both_ports() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:D2A4 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:1F90 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(find_inode(table, 0xD2A4, 0x1F90), Some(2222));
        assert_eq!(find_inode(table, 0x1F90, 0xD2A4), Some(3333));
        assert_eq!(find_inode(table, 0xD2A5, 0x1F90), None);
    }

    #[test]
    fn a_socket_of_this_process_is_found_by_its_ports() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let inode = socket_inode(
            listener.local_addr().unwrap().port(),
            client.local_addr().unwrap().port(),
        )
        .expect("the client's socket is in /proc/net/tcp");
        let target = format!("socket:[{inode}]");
        let ours = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str())
            });
        assert!(ours, "{target} is one of this process's descriptors");
    }
}
