//! POSIX shared-memory segments: the memory of the Host transport.
//!
//! A segment is created under a random name (`/mscclpp-<pid>-<128 random bits>`, mode
//! 0600, `O_EXCL`), mapped, and its name sent to the peers, which open and map it with the
//! size they were told (checked against the segment's real size). Once every peer has
//! mapped it, the creator unlinks the name ([`ShmSegment::unlink`]), so nothing is left in
//! `/dev/shm` even if a process dies later; the memory itself lives until the last mapping
//! goes. Dropping a segment unmaps it, and unlinks it if its creator never did.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fd::OwnedFd;
use rustix::fs::Mode;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm::OFlags;

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

/// A mapped POSIX shared-memory segment.
#[derive(Debug)]
pub struct ShmSegment {
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    /// Set while this process created the name and has not unlinked it.
    linked_by_us: AtomicBool,
}

// SAFETY: the mapping is plain shared memory owned by this value; the pointer is only an
// address, and concurrent access through it is governed by the users' own protocols.
unsafe impl Send for ShmSegment {}
// SAFETY: as above; `&self` methods hand out addresses only.
unsafe impl Sync for ShmSegment {}

/// Prefix of every segment name this library creates.
pub const NAME_PREFIX: &str = "/mscclpp-";

impl ShmSegment {
    /// Creates and maps a new zeroed segment of `len` bytes under a fresh random name.
    pub fn create(len: usize) -> Result<ShmSegment, ShmError> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let mut rnd = [0u8; 16];
        rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| os("getrandom", "(new)", e))?;
        let hex: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("{NAME_PREFIX}{}-{hex}", std::process::id());
        let fd = rustix::shm::open(
            name.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| os("shm_open(O_CREAT|O_EXCL)", &name, e))?;
        let mapped = rustix::fs::ftruncate(&fd, len as u64)
            .map_err(|e| os("ftruncate", &name, e))
            .and_then(|()| map(&fd, len, &name));
        match mapped {
            Ok(ptr) => Ok(ShmSegment {
                ptr,
                len,
                name,
                linked_by_us: AtomicBool::new(true),
            }),
            Err(e) => {
                let _ = rustix::shm::unlink(name.as_str());
                Err(e)
            }
        }
    }

    /// Opens and maps a peer's segment, which must be exactly `len` bytes.
    pub fn open(name: &str, len: usize) -> Result<ShmSegment, ShmError> {
        if !name.starts_with(NAME_PREFIX) || name[1..].contains('/') {
            return Err(ShmError::BadName(name.to_string()));
        }
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
            name: name.to_string(),
            linked_by_us: AtomicBool::new(false),
        })
    }

    /// Removes the name (call once every peer has mapped the segment); the mapping stays.
    /// Does nothing for segments this process did not create or already unlinked.
    pub fn unlink(&self) -> Result<(), ShmError> {
        if self.linked_by_us.swap(false, Ordering::AcqRel) {
            rustix::shm::unlink(self.name.as_str()).map_err(|e| os("shm_unlink", &self.name, e))?;
        }
        Ok(())
    }

    /// Whether the name has been removed (or was never ours to remove).
    pub fn is_unlinked(&self) -> bool {
        !self.linked_by_us.load(Ordering::Acquire)
    }

    /// The segment's name, to send to peers.
    pub fn name(&self) -> &str {
        &self.name
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
        if *self.linked_by_us.get_mut() {
            let _ = rustix::shm::unlink(self.name.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_written_through_one_mapping_is_read_through_another() {
        let a = ShmSegment::create(4096).unwrap();
        assert!(a.name().starts_with(NAME_PREFIX));
        let b = ShmSegment::open(a.name(), 4096).unwrap();
        // SAFETY: both mappings are 4096 bytes; this thread is the only accessor.
        unsafe {
            assert_eq!(*b.as_ptr().add(100), 0, "new segments are zeroed");
            a.as_ptr().add(100).write_volatile(0xab);
            assert_eq!(b.as_ptr().add(100).read_volatile(), 0xab);
        }
        a.unlink().unwrap();
        // The name is gone, the mappings still work.
        assert!(matches!(
            ShmSegment::open(a.name(), 4096),
            Err(ShmError::Os { .. })
        ));
        // SAFETY: as above.
        unsafe { assert_eq!(b.as_ptr().add(100).read_volatile(), 0xab) };
    }

    #[test]
    fn drop_unlinks_a_segment_nobody_unlinked() {
        let a = ShmSegment::create(64).unwrap();
        let name = a.name().to_string();
        drop(a);
        assert!(matches!(
            ShmSegment::open(&name, 64),
            Err(ShmError::Os { .. })
        ));
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        assert!(matches!(ShmSegment::create(0), Err(ShmError::Empty)));
        let e = ShmSegment::open("/etc-passwd", 8).unwrap_err();
        assert!(matches!(e, ShmError::BadName(_)), "{e}");
        let a = ShmSegment::create(128).unwrap();
        let e = ShmSegment::open(a.name(), 256).unwrap_err();
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
