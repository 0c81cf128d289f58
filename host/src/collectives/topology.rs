//! Where the ranks are: hosts (bootstrap host ids), machines, and the groups the
//! collectives cut hosts into when hosts differ in size or exceed
//! [`MAX_RANKS`](mscclpp_device::collectives::MAX_RANKS) ranks.

use crate::communicator::{CommError, Communicator};
use crate::transport::TransportKind;

/// The groups of ranks the collectives treat as hosts, from the machines' ranks (`machines[m]`:
/// the ranks of the machine with bootstrap host id `ids[m]`, ascending): the machines
/// themselves when they are alike and of at most [`MAX_RANKS`] ranks (no note); otherwise
/// every machine cut into groups of `g` consecutive ranks, `g` the largest number of at most
/// [`MAX_RANKS`] that divides every machine's rank count (1 at worst: every rank its own
/// host), in the order of their lowest rank, with a note saying why.
pub(super) fn group_hosts(
    machines: Vec<Vec<usize>>,
    ids: &[String],
) -> (Vec<Vec<usize>>, Option<String>) {
    let max = mscclpp_device::collectives::MAX_RANKS;
    let oversized = machines.iter().position(|r| r.len() > max);
    let unequal = machines.iter().position(|r| r.len() != machines[0].len());
    let reason = match (oversized, unequal) {
        (Some(h), _) => format!(
            "host {:?} has {} ranks, more than the {max} a host's memory channels serve",
            ids[h],
            machines[h].len()
        ),
        (None, Some(h)) => format!(
            "host {:?} has {} ranks and host {:?} {} (each rank's partners on the other hosts \
             are the ranks of its local index, so hosts must be alike)",
            ids[0],
            machines[0].len(),
            ids[h],
            machines[h].len()
        ),
        (None, None) => return (machines, None),
    };
    let common = machines.iter().fold(0, |g, r| gcd(g, r.len()));
    let g = (1..=max.min(common))
        .rev()
        .find(|d| common % d == 0)
        .unwrap_or(1);
    let mut groups: Vec<Vec<usize>> = machines
        .iter()
        .flat_map(|r| r.chunks(g).map(<[usize]>::to_vec))
        .collect();
    groups.sort_by_key(|r| r[0]);
    let note = if g == 1 {
        format!(
            "{reason}: every rank is its own host for the collectives, all their traffic goes \
             over proxy channels (the network transport between machines, the copy engine or \
             shared memory inside one; no memory-channel kernels), and sums are in rank order"
        )
    } else {
        format!(
            "{reason}: the collectives treat each host as groups of {g} ranks (the largest \
             size of at most {max} that divides every host's rank count; {} groups in all): \
             ranks of a group talk over memory channels, groups over proxy channels (the \
             network transport between machines, the copy engine or shared memory inside \
             one), and sums are per group in rank order, then across groups",
            groups.len()
        )
    };
    (groups, Some(note))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The hosts of a communicator: its ranks grouped by bootstrap host id, hosts in the order of
/// their lowest rank, ranks ascending within a host (machines that are not alike, or of more
/// than [`MAX_RANKS`] ranks, cut into groups that are: [`group_hosts`]).
#[derive(Debug, Clone)]
pub(super) struct Topology {
    /// `hosts[h]`: the ranks of host `h`.
    pub(super) hosts: Vec<Vec<usize>>,
    /// This rank's host.
    pub(super) host: usize,
    /// This rank's index in its host's ranks.
    pub(super) local: usize,
    /// Why the hosts are not used as such, if they are not: hosts of different sizes, or
    /// one with more ranks than [`MAX_RANKS`]; each is then cut into groups of one size
    /// ([`group_hosts`]), at worst every rank its own host.
    pub(super) flat: Option<String>,
    /// The machine (bootstrap host id, numbered in order of first rank) of every rank: when
    /// machines are cut into groups, ranks of one machine are different hosts but need no
    /// network.
    machine: Vec<usize>,
    /// The host (index into `hosts`) of every rank.
    host_index: Vec<usize>,
    /// This rank.
    rank: usize,
}

impl Topology {
    /// Reads every rank's host id from the bootstrap (every rank reads the same table, so
    /// every rank builds the same topology). Hosts of different sizes, or one of more than
    /// [`MAX_RANKS`] ranks, are cut into groups of one size ([`group_hosts`]).
    pub(super) fn of(comm: &Communicator) -> Result<Topology, CommError> {
        let bs = comm.bootstrap().as_async();
        let mut ids: Vec<String> = Vec::new();
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut machine = Vec::with_capacity(comm.nranks());
        for r in 0..comm.nranks() {
            let id = bs.host_id(r).unwrap_or("?").to_string();
            match ids.iter().position(|x| *x == id) {
                Some(h) => {
                    hosts[h].push(r);
                    machine.push(h);
                }
                None => {
                    machine.push(ids.len());
                    ids.push(id);
                    hosts.push(vec![r]);
                }
            }
        }
        let me = comm.rank();
        let (hosts, flat) = group_hosts(hosts, &ids);
        let mut host_index = vec![0; comm.nranks()];
        for (h, ranks) in hosts.iter().enumerate() {
            for &r in ranks {
                host_index[r] = h;
            }
        }
        let host = host_index[me];
        let local = hosts[host].iter().position(|&r| r == me).expect("listed");
        Ok(Topology {
            hosts,
            host,
            local,
            flat,
            machine,
            host_index,
            rank: me,
        })
    }

    /// The transport of a proxy channel to rank `p`: `local` (the backend's own, P2P or
    /// Host) when `p` shares this rank's machine (only in a flat topology), else `network`.
    pub(super) fn transport_to(
        &self,
        p: usize,
        network: TransportKind,
        local: TransportKind,
    ) -> TransportKind {
        if self.machine[p] == self.machine[self.rank] {
            local
        } else {
            network
        }
    }

    /// Ranks of this rank's host (the local group), ascending.
    pub(super) fn group(&self) -> &[usize] {
        &self.hosts[self.host]
    }

    /// The host of rank `r`.
    pub(super) fn host_of(&self, r: usize) -> usize {
        self.host_index[r]
    }

    /// Whether ranks `a` and `b` are on one machine (one bootstrap host id), which they may
    /// be on different hosts of the collectives when machines are cut into groups.
    pub(super) fn same_machine(&self, a: usize, b: usize) -> bool {
        self.machine[a] == self.machine[b]
    }

    /// Host `h` in words for errors: `host 1`, or, where machines are cut into groups (the
    /// collectives' hosts are then not the user's), `host 1, group 3` (the machine numbered
    /// in order of first rank, as the user's host ids are).
    pub(super) fn host_name(&self, h: usize) -> String {
        match self.hosts.get(h) {
            Some(ranks) if self.flat.is_some() => {
                format!("host {}, group {h}", self.machine[ranks[0]])
            }
            _ => format!("host {h}"),
        }
    }

    /// The rank of local index `local` on host `h`.
    pub(super) fn rank_at(&self, h: usize, local: usize) -> usize {
        self.hosts[h][local]
    }
}
