//! Global allocators for milkit's binaries: the system allocator plus a transparent huge
//! page hint (Linux `madvise(MADV_HUGEPAGE)`) on every allocation of 2 MiB or more.
//! Decoding streams tens of megabytes of weights (and cached keys and values) per token;
//! on 4 KiB pages that is one TLB miss every 4 KiB, and where the kernel grants huge pages
//! only on request (`transparent_hugepage=madvise`, a common default) streaming reads ran
//! about 1.3× faster from 2 MiB pages on the development machine. The hint changes no
//! value and is ignored where the kernel does not support it. [`Counting`] is the same
//! allocator that also counts the bytes it has handed out and not yet taken back, and the
//! most at once ([`live_bytes`], [`peak_bytes`]), so tests can bound what a stage
//! allocates; the `milkit` binary and the Python extension do not count, since every
//! allocation would then update one shared counter and threads predicting at once would
//! queue on its cache line. [`one_arena`] keeps glibc from giving every worker thread a
//! heap of its own. Uses nothing else in milkit.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated through [`Counting`] and not yet freed (0 where it is not the global
/// allocator).
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most [`live_bytes`] since the start or the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new peak from the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

fn shrank(by: usize) {
    LIVE.fetch_sub(by, Ordering::Relaxed);
}

/// Makes glibc's malloc serve every thread from one arena (`M_ARENA_MAX` = 1), unless the
/// environment sets the arena count itself (`MALLOC_ARENA_MAX`, or `arena_max` in
/// `GLIBC_TUNABLES`). By default each worker thread that allocates gets an arena of its
/// own, and what a worker frees there (a GEMM's panels, an op's output) stays resident
/// for that worker: transcribing 153 s with tiny.en peaked at 258 MB against 216 MB with
/// one arena, at the same CPU time (2 threads). Call it first thing in `main`, before any
/// thread exists. Does nothing on other C libraries.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() && !tunables.contains("arena_max") {
            // SAFETY: mallopt only changes a malloc parameter; called before threads
            // exist, and a refusal (return 0) leaves the default in place.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        }
    }
}

/// Allocations from this size up get the hint.
const HUGE: usize = 2 << 20;

/// The system allocator with a huge page hint on large blocks. Install it with
/// `#[global_allocator] static A: milkit::alloc::HugePageHint = milkit::alloc::HugePageHint;`
pub struct HugePageHint;

/// Hints the 2 MiB-aligned part of `[p, p + len)`.
fn advise(p: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let start = (p as usize).next_multiple_of(HUGE);
        let end = (p as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside a block the caller just allocated; madvise with
            // MADV_HUGEPAGE only changes how the kernel backs those pages, never their
            // contents, and its failure (e.g. no THP support) is harmless.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

// SAFETY: every call is forwarded to `System` with the same arguments; the hint only
// touches the kernel's paging policy of memory this allocator handed out.
unsafe impl GlobalAlloc for HugePageHint {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() && l.size() >= HUGE {
            advise(p, l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() && l.size() >= HUGE {
            advise(p, l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(p, l) };
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() && new >= HUGE {
            advise(q, new);
        }
        q
    }
}

/// [`HugePageHint`] that also counts live and peak bytes ([`live_bytes`], [`peak_bytes`]).
/// Install it with `#[global_allocator] static A: milkit::alloc::Counting = milkit::alloc::Counting;`
pub struct Counting;

// SAFETY: every call is forwarded to `HugePageHint` with the same arguments; the counters
// are plain atomics beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { HugePageHint.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { HugePageHint.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded as is.
        unsafe { HugePageHint.dealloc(p, l) };
        shrank(l.size());
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let q = unsafe { HugePageHint.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                grew(new - l.size());
            } else {
                shrank(l.size() - new);
            }
        }
        q
    }
}
