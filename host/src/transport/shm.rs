//! POSIX shared-memory segments: the memory of the Host transport.
//!
//! A segment is created without a name (`O_TMPFILE` in `/dev/shm`, mode 0600) and mapped,
//! so a segment nobody shares, or whose creator dies before sharing it, leaves nothing in
//! `/dev/shm`. To share it, the creator gives it a fresh random name for one peer
//! ([`ShmSegment::publish`]: `/mscclpp-<pid>-<128 random bits>`, linked to the open file)
//! and sends the name; the peer opens and maps it with the size it was told (checked against
//! the segment's real size) and removes the name at once ([`remove_name`]), since it is the
//! name's only user. The creator removes every name it published once the peers have
//! acknowledged, or when setup fails, so a name outlives neither the setup round nor the
//! death of either side for longer than a message takes to arrive. The memory itself lives
//! until the last mapping goes. Dropping a segment unmaps it.
//!
//! Where `O_TMPFILE` is not available, a segment is created under its name at once (the
//! older scheme); [`publish`](ShmSegment::publish) then returns that name and
//! [`unlink`](ShmSegment::unlink) or drop removes it.
//!
//! A segment's memory is reserved when it is made (`fallocate`), not at first touch: a
//! `/dev/shm` too small for it (64 MiB is a container's default) fails [`ShmSegment::create`]
//! with [`ShmError::NoSpace`], which says how large `/dev/shm` is and how to raise it,
//! where a page touched beyond the space left would kill the process with `SIGBUS`.

use std::ptr::NonNull;
use std::sync::Mutex;

use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, Mode};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm::OFlags;

pub use crate::units::bytes_text;

/// Errors of shared-memory segments.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A zero-sized segment was asked for.
    #[error("shared-memory segment of 0 bytes")]
    Empty,
    /// A name that is not one of ours.
    #[error("`{0}` is not a shared-memory segment name of this library (/mscclpp-...)")]
    BadName(String),
    /// The segment exists but has another size than the peer said.
    #[error("shared-memory segment {name} is {actual} bytes, expected {expected}")]
    SizeMismatch {
        /// Segment name.
        name: String,
        /// What the caller expected.
        expected: usize,
        /// What it is.
        actual: u64,
    },
    /// `/dev/shm` has no room left for a new segment (`fallocate` said `ENOSPC`).
    #[error(
        "{SHM_DIR} has no room for a shared-memory segment of {}: it holds {} in all, {} of it \
         free (the Host transport keeps the buffers of every rank of this machine there); \
         raise its size (a container: `docker run --shm-size=<size>`, or `--ipc=host`; \
         else, as root, `mount -o remount,size=<size> {SHM_DIR}`), or need less of it: fewer \
         ranks, smaller buffers, or a smaller scratch for the collectives \
         (MSCCLPP_COLL_SCRATCH_BYTES)",
        bytes_text(*.needed as u128),
        bytes_text(u128::from(*.size)),
        bytes_text(u128::from(*.free))
    )]
    NoSpace {
        /// Bytes of the segment.
        needed: usize,
        /// Size of the file system of `/dev/shm` (bytes; 0 when unknown).
        size: u64,
        /// Bytes free in it when the segment was refused (0 when unknown).
        free: u64,
    },
    /// A system call failed.
    #[error("{call} on shared-memory segment {name}: {error}")]
    Os {
        /// The call.
        call: &'static str,
        /// Segment name.
        name: String,
        /// The OS error.
        error: std::io::Error,
    },
}

fn os(call: &'static str, name: &str, e: rustix::io::Errno) -> ShmError {
    ShmError::Os {
        call,
        name: name.to_string(),
        error: e.into(),
    }
}

/// Where POSIX shared-memory names live on Linux (what `shm_open` opens).
pub const SHM_DIR: &str = "/dev/shm";

/// Size and free space of the file system of `/dev/shm`, where the Host transport's
/// segments live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmSpace {
    /// Size in bytes.
    pub size: u64,
    /// Bytes an unprivileged process may still fill.
    pub free: u64,
}

/// The size and free space of `/dev/shm` (`statvfs`), for checks made before segments are
/// made; `None` where it cannot be read (no `/dev/shm`).
pub fn shm_space() -> Option<ShmSpace> {
    let st = rustix::fs::statvfs(SHM_DIR).ok()?;
    Some(ShmSpace {
        size: st.f_blocks.saturating_mul(st.f_frsize),
        free: st.f_bavail.saturating_mul(st.f_frsize),
    })
}

/// Sizes the new segment file `fd` to `len` bytes and reserves its memory, so that touching
/// any of it later cannot fail: a full `/dev/shm` is [`ShmError::NoSpace`] here instead of a
/// `SIGBUS` at first touch. Where the file system cannot reserve (`EOPNOTSUPP`), it is only
/// sized, as before.
fn size_and_reserve(fd: &OwnedFd, len: usize, name: &str) -> Result<(), ShmError> {
    rustix::fs::ftruncate(fd, len as u64).map_err(|e| os("ftruncate", name, e))?;
    loop {
        match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, len as u64) {
            Ok(()) => return Ok(()),
            // tmpfs gives up (and undoes) a long reservation when a signal comes: again.
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => return Ok(()),
            Err(rustix::io::Errno::NOSPC) => {
                let space = rustix::fs::fstatvfs(fd).ok();
                let bytes = |count: fn(&rustix::fs::StatVfs) -> u64| {
                    space
                        .as_ref()
                        .map_or(0, |s| count(s).saturating_mul(s.f_frsize))
                };
                return Err(ShmError::NoSpace {
                    needed: len,
                    size: bytes(|s| s.f_blocks),
                    free: bytes(|s| s.f_bavail),
                });
            }
            Err(e) => return Err(os("fallocate", name, e)),
        }
    }
}

/// A mapped POSIX shared-memory segment.
#[derive(Debug)]
pub struct ShmSegment {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
}

#[derive(Debug)]
enum Origin {
    /// Created here without a name; the file stays open so that names can be linked to it.
    /// `published` once it has been given a name (one setup round shares it).
    Anonymous {
        fd: OwnedFd,
        published: std::sync::atomic::AtomicBool,
    },
    /// Created here under `name` (no `O_TMPFILE`); `linked` while the name exists.
    Named { name: String, linked: Mutex<bool> },
    /// A peer's segment, opened by `name` (which its opener removed).
    Opened { name: String },
}

// SAFETY: the mapping is plain shared memory owned by this value; the pointer is only an
// address, and concurrent access through it is governed by the users' own protocols.
unsafe impl Send for ShmSegment {}
// SAFETY: as above; `&self` methods hand out addresses only (the name state is locked).
unsafe impl Sync for ShmSegment {}

/// Prefix of every segment name this library creates.
pub const NAME_PREFIX: &str = "/mscclpp-";

/// A fresh random name, `/mscclpp-<pid>-<32 hex digits>`.
fn fresh_name() -> Result<String, ShmError> {
    let mut rnd = [0u8; 16];
    rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| os("getrandom", "(new)", e))?;
    let hex: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{NAME_PREFIX}{}-{hex}", std::process::id()))
}

fn check_name(name: &str) -> Result<(), ShmError> {
    if !name.starts_with(NAME_PREFIX) || name[1..].contains('/') {
        return Err(ShmError::BadName(name.to_string()));
    }
    Ok(())
}

/// Removes the name `name` (one of ours, `/mscclpp-...`) if it still exists; mappings of
/// the segment stay. A peer calls it as soon as it has mapped a segment it was sent, and
/// for every name it was sent but will not map; the creator for every name it published.
pub fn remove_name(name: &str) -> Result<(), ShmError> {
    check_name(name)?;
    match rustix::shm::unlink(name) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(os("shm_unlink", name, e)),
    }
}

/// Removes every name a dead process `pid` of this machine left (`/mscclpp-<pid>-...`),
/// returning how many: a rank killed after it published names for its peers and before they
/// received them leaves names nobody else knows, each holding its segment's memory. Its
/// peers call this for a rank the bootstrap reports lost on their host. Nothing is removed
/// for this process, or while process `pid` exists and is not a zombie (its names may be in
/// use); Linux only (elsewhere 0).
pub fn remove_names_of_dead(pid: u32) -> usize {
    if pid == std::process::id() || !crate::procfs::process_gone(pid) {
        return 0;
    }
    let prefix = format!("{}{pid}-", &NAME_PREFIX[1..]);
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .filter(|n| remove_name(&format!("/{n}")).is_ok())
        .count()
}

impl ShmSegment {
    /// Creates and maps a new zeroed segment of `len` bytes, without a name (see the
    /// [module](self)).
    pub fn create(len: usize) -> Result<ShmSegment, ShmError> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let fd = match rustix::fs::openat(
            CWD,
            SHM_DIR,
            rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        ) {
            Ok(fd) => fd,
            // No O_TMPFILE here (or no /dev/shm): a named segment, the older scheme.
            Err(_) => return ShmSegment::create_named(len),
        };
        size_and_reserve(&fd, len, "(anonymous)")?;
        let ptr = map(&fd, len, "(anonymous)")?;
        Ok(ShmSegment {
            ptr,
            len,
            origin: Origin::Anonymous {
                fd,
                published: std::sync::atomic::AtomicBool::new(false),
            },
        })
    }

    /// Creates and maps a new zeroed segment under a fresh random name (`O_EXCL`).
    fn create_named(len: usize) -> Result<ShmSegment, ShmError> {
        let name = fresh_name()?;
        let fd = rustix::shm::open(
            name.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| os("shm_open(O_CREAT|O_EXCL)", &name, e))?;
        let mapped = size_and_reserve(&fd, len, &name).and_then(|()| map(&fd, len, &name));
        match mapped {
            Ok(ptr) => Ok(ShmSegment {
                ptr,
                len,
                origin: Origin::Named {
                    name,
                    linked: Mutex::new(true),
                },
            }),
            Err(e) => {
                let _ = rustix::shm::unlink(name.as_str());
                Err(e)
            }
        }
    }

    /// Opens and maps a peer's segment, which must be exactly `len` bytes. The name stays;
    /// remove it with [`remove_name`] once mapped.
    pub fn open(name: &str, len: usize) -> Result<ShmSegment, ShmError> {
        check_name(name)?;
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let fd = rustix::shm::open(name, OFlags::RDWR, Mode::empty())
            .map_err(|e| os("shm_open", name, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| os("fstat", name, e))?;
        if st.st_size as u64 != len as u64 {
            return Err(ShmError::SizeMismatch {
                name: name.to_string(),
                expected: len,
                actual: st.st_size as u64,
            });
        }
        let ptr = map(&fd, len, name)?;
        Ok(ShmSegment {
            ptr,
            len,
            origin: Origin::Opened {
                name: name.to_string(),
            },
        })
    }

    /// Gives a segment this process created a new name for one peer to open, and returns
    /// it. The caller removes it with [`remove_name`] once the peer has mapped the segment
    /// (or will not), whatever happens. Publish every name a segment needs before removing
    /// any: once all its names are gone, an unnamed segment cannot get another (so a
    /// segment is shared in one setup round; see [`was_shared`](Self::was_shared)). A
    /// segment created under a name (no `O_TMPFILE`) returns that name while it exists.
    pub fn publish(&self) -> Result<String, ShmError> {
        match &self.origin {
            Origin::Anonymous { fd, published } => {
                published.store(true, std::sync::atomic::Ordering::Relaxed);
                let name = fresh_name()?;
                let from = format!("/proc/self/fd/{}", fd.as_raw_fd());
                rustix::fs::linkat(
                    CWD,
                    from.as_str(),
                    CWD,
                    format!("{SHM_DIR}{name}").as_str(),
                    AtFlags::SYMLINK_FOLLOW,
                )
                .map_err(|e| os("linkat", &name, e))?;
                Ok(name)
            }
            Origin::Named { name, linked } => {
                if *linked.lock().unwrap_or_else(|e| e.into_inner()) {
                    Ok(name.clone())
                } else {
                    Err(ShmError::Os {
                        call: "publish",
                        name: name.clone(),
                        error: std::io::Error::other(
                            "the segment's name was already removed (no O_TMPFILE here: a segment is shared in one setup only)",
                        ),
                    })
                }
            }
            Origin::Opened { name } => Err(ShmError::Os {
                call: "publish",
                name: name.clone(),
                error: std::io::Error::other("only the creator of a segment publishes it"),
            }),
        }
    }

    /// Removes the name of a segment created under one (no `O_TMPFILE`); the mapping stays.
    /// Does nothing for other segments (their names are removed by [`remove_name`]).
    pub fn unlink(&self) -> Result<(), ShmError> {
        if let Origin::Named { name, linked } = &self.origin {
            let mut linked = linked.lock().unwrap_or_else(|e| e.into_inner());
            if *linked {
                *linked = false;
                remove_name(name)?;
            }
        }
        Ok(())
    }

    /// Whether a setup round already shared this segment (it was published, or its own
    /// name removed): it cannot be shared again.
    pub fn was_shared(&self) -> bool {
        match &self.origin {
            Origin::Anonymous { published, .. } => {
                published.load(std::sync::atomic::Ordering::Relaxed)
            }
            Origin::Named { linked, .. } => !*linked.lock().unwrap_or_else(|e| e.into_inner()),
            Origin::Opened { .. } => true,
        }
    }

    /// The name the segment was created or opened under, if any (anonymous segments have
    /// none of their own: see [`publish`](Self::publish)).
    pub fn name(&self) -> Option<&str> {
        match &self.origin {
            Origin::Anonymous { .. } => None,
            Origin::Named { name, .. } | Origin::Opened { name } => Some(name),
        }
    }

    /// Start of the mapping in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty segments are refused.
    pub fn is_empty(&self) -> bool {
        false
    }
}

fn map(fd: &OwnedFd, len: usize, name: &str) -> Result<NonNull<u8>, ShmError> {
    // SAFETY: a fresh shared mapping of `len` bytes of `fd` at an address the kernel picks;
    // it aliases no Rust object.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| os("mmap", name, e))?;
    NonNull::new(p as *mut u8).ok_or_else(|| ShmError::Os {
        call: "mmap",
        name: name.to_string(),
        error: std::io::Error::other("null mapping"),
    })
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `map`, unmapped once here.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr() as *mut _, self.len) };
        let _ = self.unlink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(name: &str) -> bool {
        std::path::Path::new(&format!("{SHM_DIR}{name}")).exists()
    }

    /// A name as process `pid` would publish it, made here (an empty file in /dev/shm).
    fn name_of(pid: u32) -> String {
        let name = format!("{NAME_PREFIX}{pid}-{:032x}", u128::from(pid) * 7919);
        std::fs::write(format!("{SHM_DIR}{name}"), b"").unwrap();
        name
    }

    /// The names of a process that has ended are removed; those of a live process (here a
    /// sleeping child) and of this process are kept.
    #[test]
    #[cfg(target_os = "linux")]
    fn names_of_a_dead_process_are_removed_and_no_others() {
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        ended.wait().unwrap();
        let mut alive = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (dead, live, mine) = (
            name_of(ended.id()),
            name_of(alive.id()),
            name_of(std::process::id()),
        );
        assert_eq!(remove_names_of_dead(ended.id()), 1);
        assert!(!exists(&dead));
        assert_eq!(remove_names_of_dead(alive.id()), 0);
        assert_eq!(remove_names_of_dead(std::process::id()), 0);
        assert!(exists(&live) && exists(&mine));
        // Killed but not reaped: a zombie counts as ended.
        alive.kill().unwrap();
        let zombie = std::time::Instant::now();
        while !crate::procfs::process_gone(alive.id()) {
            assert!(zombie.elapsed() < std::time::Duration::from_secs(5));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(remove_names_of_dead(alive.id()), 1);
        assert!(!exists(&live));
        alive.wait().unwrap();
        remove_name(&mine).unwrap();
    }

    #[test]
    fn a_segment_written_through_one_mapping_is_read_through_another() {
        let a = ShmSegment::create(4096).unwrap();
        let name = a.publish().unwrap();
        assert!(name.starts_with(NAME_PREFIX));
        let b = ShmSegment::open(&name, 4096).unwrap();
        remove_name(&name).unwrap();
        // SAFETY: both mappings are 4096 bytes; this thread is the only accessor.
        unsafe {
            assert_eq!(*b.as_ptr().add(100), 0, "new segments are zeroed");
            a.as_ptr().add(100).write_volatile(0xab);
            assert_eq!(b.as_ptr().add(100).read_volatile(), 0xab);
        }
        // The name is gone, the mappings still work.
        assert!(!exists(&name));
        assert!(matches!(
            ShmSegment::open(&name, 4096),
            Err(ShmError::Os { .. })
        ));
        // SAFETY: as above.
        unsafe { assert_eq!(b.as_ptr().add(100).read_volatile(), 0xab) };
        remove_name(&name).unwrap();
    }

    #[test]
    fn each_publish_is_a_new_name_for_the_same_memory() {
        let a = ShmSegment::create(64).unwrap();
        let (n1, n2) = (a.publish().unwrap(), a.publish().unwrap());
        if a.name().is_none() {
            assert_ne!(n1, n2, "anonymous segments get a name per peer");
        }
        let b = ShmSegment::open(&n2, 64).unwrap();
        // SAFETY: both mappings are 64 bytes; this thread is the only accessor.
        unsafe {
            a.as_ptr().write_volatile(7);
            assert_eq!(b.as_ptr().read_volatile(), 7);
        }
        remove_name(&n1).unwrap();
        remove_name(&n2).unwrap();
        assert!(!exists(&n1) && !exists(&n2));
    }

    #[test]
    fn a_named_segment_is_removed_by_drop() {
        let a = ShmSegment::create_named(64).unwrap();
        let name = a.name().unwrap().to_string();
        assert!(exists(&name));
        drop(a);
        assert!(!exists(&name));
    }

    /// A full `/dev/shm` is a [`ShmError::NoSpace`] that names it, its size and free space,
    /// and how to raise it. (That segments are reserved when made is checked end to end, in
    /// a small tmpfs, by `tests/shm_space.rs`.)
    #[test]
    fn no_space_says_how_large_dev_shm_is_and_how_to_raise_it() {
        let e = ShmError::NoSpace {
            needed: 256 << 20,
            size: 64 << 20,
            free: 3 << 19,
        };
        let text = e.to_string();
        for says in [
            "/dev/shm has no room for a shared-memory segment of 256.0 MiB",
            "64.0 MiB in all, 1.5 MiB of it free",
            "docker run --shm-size=",
            "mount -o remount,size=",
            "MSCCLPP_COLL_SCRATCH_BYTES",
        ] {
            assert!(text.contains(says), "{says:?}: {text}");
        }
        assert_eq!(bytes_text(1023), "1023 B");
        let space = shm_space().expect("/dev/shm is readable here");
        assert!(space.free <= space.size && space.size > 0, "{space:?}");
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        assert!(matches!(ShmSegment::create(0), Err(ShmError::Empty)));
        let e = ShmSegment::open("/etc-passwd", 8).unwrap_err();
        assert!(matches!(e, ShmError::BadName(_)), "{e}");
        assert!(matches!(
            remove_name("/etc-passwd"),
            Err(ShmError::BadName(_))
        ));
        let a = ShmSegment::create(128).unwrap();
        let name = a.publish().unwrap();
        let e = ShmSegment::open(&name, 256).unwrap_err();
        remove_name(&name).unwrap();
        assert!(
            matches!(
                e,
                ShmError::SizeMismatch {
                    expected: 256,
                    actual: 128,
                    ..
                }
            ),
            "{e}"
        );
        let e = ShmSegment::open("/mscclpp-0-doesnotexist", 8).unwrap_err();
        assert!(e.to_string().contains("shm_open"), "{e}");
    }
}
