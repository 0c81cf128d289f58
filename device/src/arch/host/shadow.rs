//! Shadow memory for model checking with loom (only under `--cfg mscclpp_loom`).
//!
//! Protocol code addresses shared words by raw pointer (the same code runs on the GPU), but
//! a loom atomic is an object of its own that cannot be laid over existing memory. So,
//! under this cfg, every `arch` memory-model access looks up the loom atomic registered
//! for its address in a per-OS-thread table (loom runs a model's threads as coroutines on
//! the calling OS thread, so each `#[test]` has its own table). The protocol code itself,
//! `fifo`'s push and pop included, runs unchanged: only the words under it are swapped.
//!
//! Inside each `loom::model` execution: create a [`ShadowMemory`], register every word the
//! model's threads will touch, and keep the guard alive until the threads are joined. An
//! access to an address that was not registered panics, naming it.
//!
//! ```text
//! loom::model(|| {
//!     let shadow = ShadowMemory::new();
//!     // SAFETY: `words` outlives `shadow` and is only accessed through `arch`.
//!     unsafe { shadow.add_u64_words(words.as_mut_ptr(), words.len()) };
//!     // ... spawn loom threads that run protocol code over `words` ...
//! });
//! ```

use core::cell::RefCell;
use core::marker::PhantomData;
use loom::sync::atomic::{AtomicU32, AtomicU64};
use std::rc::Rc;
use std::vec::Vec;

enum Word {
    U64(Rc<AtomicU64>),
    U32(Rc<AtomicU32>),
}

std::thread_local! {
    static TABLE: RefCell<Vec<(usize, Word)>> = const { RefCell::new(Vec::new()) };
}

fn lookup<T>(addr: usize, pick: impl Fn(&Word) -> Option<T>) -> T {
    TABLE.with(|t| {
        let t = t.borrow();
        match t.iter().find(|(a, _)| *a == addr) {
            Some((_, w)) => pick(w).unwrap_or_else(|| {
                panic!("loom shadow: {addr:#x} was registered with another width")
            }),
            None => panic!(
                "loom shadow: {addr:#x} is not registered; add it with ShadowMemory before \
                 the model's threads use it"
            ),
        }
    })
}

/// The loom atomic registered for the `u64` at `p`.
///
/// # Safety
/// None beyond the registration (kept `unsafe` to match the non-loom signature).
pub(super) unsafe fn atomic_u64(p: *mut u64) -> Rc<AtomicU64> {
    lookup(p as usize, |w| match w {
        Word::U64(a) => Some(a.clone()),
        Word::U32(_) => None,
    })
}

/// The loom atomic registered for the `u32` at `p`.
///
/// # Safety
/// None beyond the registration (kept `unsafe` to match the non-loom signature).
pub(super) unsafe fn atomic_u32(p: *mut u32) -> Rc<AtomicU32> {
    lookup(p as usize, |w| match w {
        Word::U32(a) => Some(a.clone()),
        Word::U64(_) => None,
    })
}

/// The table of loom atomics for one model execution; cleared when created and when
/// dropped. Create it inside `loom::model`, on the thread that runs the model.
#[derive(Debug)]
pub struct ShadowMemory {
    // The table is per OS thread: keep the guard on the thread that made it.
    _not_send: PhantomData<*const ()>,
}

impl ShadowMemory {
    /// An empty table (replacing any left over from an execution that panicked).
    #[allow(clippy::new_without_default)] // a guard with effects, not a value
    pub fn new() -> ShadowMemory {
        TABLE.with(|t| t.borrow_mut().clear());
        ShadowMemory {
            _not_send: PhantomData,
        }
    }

    /// Registers the `n` consecutive `u64` words at `p`, each starting from its current
    /// value. From now until the guard drops, `arch` accesses to them use loom atomics and
    /// the memory itself is neither read nor written.
    ///
    /// # Safety
    /// `p` must be valid for reading `n` aligned `u64`s.
    pub unsafe fn add_u64_words(&self, p: *mut u64, n: usize) {
        for i in 0..n {
            let w = p.wrapping_add(i);
            // SAFETY: within the `n` readable words (caller contract).
            let v = unsafe { w.read() };
            self.insert(w as usize, Word::U64(Rc::new(AtomicU64::new(v))));
        }
    }

    /// Registers the `n` consecutive `u32` words at `p`; see [`add_u64_words`](Self::add_u64_words).
    ///
    /// # Safety
    /// `p` must be valid for reading `n` aligned `u32`s.
    pub unsafe fn add_u32_words(&self, p: *mut u32, n: usize) {
        for i in 0..n {
            let w = p.wrapping_add(i);
            // SAFETY: within the `n` readable words (caller contract).
            let v = unsafe { w.read() };
            self.insert(w as usize, Word::U32(Rc::new(AtomicU32::new(v))));
        }
    }

    fn insert(&self, addr: usize, word: Word) {
        TABLE.with(|t| {
            let mut t = t.borrow_mut();
            t.retain(|(a, _)| *a != addr);
            t.push((addr, word));
        });
    }
}

impl Drop for ShadowMemory {
    fn drop(&mut self) {
        // Loom objects belong to one execution: never let one leak into the next.
        TABLE.with(|t| t.borrow_mut().clear());
    }
}
