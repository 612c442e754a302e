//! Where a packed weight's bulk (fp16/f32 values, 4-bit codes) lives: a vector of its own,
//! or a range of an arena shared by many weights. A model's many small weights (a tiny
//! decoder's 384 × 384 projections are 288 KB each) are each below the 2 MiB a huge page
//! needs, so on their own they sit on 4 KiB pages, and a cold 288 KB read from those
//! measured about 10 GB/s on one thread against about 16 GB/s from huge pages. Moved into
//! one arena of their combined size ([`share_arena`]), they get huge pages wherever large
//! blocks do (see `crate::alloc`).

use super::{Packed, PackedWeight};
use bytemuck::Pod;
use rayon::prelude::*;
use std::ops::Deref;
use std::sync::Arc;

/// Weights stored from this size up keep their own allocation (which is large enough for
/// huge pages itself); smaller ones move into the arena.
pub const OWN_FROM: usize = 2 << 20;

/// Immutable elements of type `T`: owned, or borrowed from a shared arena it keeps alive.
pub struct Store<T: Pod> {
    ptr: *const T,
    len: usize,
    owner: Owner<T>,
}

enum Owner<T> {
    Vec(Vec<T>),
    /// 8-byte words, so that every element type of a packed weight is aligned in it.
    Arena(Arc<Vec<u64>>),
}

// SAFETY: a Store never hands out mutable access; `ptr` points into memory owned by
// `owner` (a Vec whose buffer does not move when the Vec does, or an Arc'd arena), which
// lives as long as the Store, so sharing or sending it is as safe as for `Vec<T>`.
unsafe impl<T: Pod + Send> Send for Store<T> {}
unsafe impl<T: Pod + Sync> Sync for Store<T> {}

impl<T: Pod> Store<T> {
    pub fn new(v: Vec<T>) -> Store<T> {
        Store {
            ptr: v.as_ptr(),
            len: v.len(),
            owner: Owner::Vec(v),
        }
    }

    /// `len` elements at byte `offset` of `arena` (aligned for `T`, in bounds).
    fn in_arena(arena: &Arc<Vec<u64>>, offset: usize, len: usize) -> Store<T> {
        let bytes: &[u8] = bytemuck::cast_slice(arena.as_slice());
        let slice: &[T] = bytemuck::cast_slice(&bytes[offset..offset + len * size_of::<T>()]);
        Store {
            ptr: slice.as_ptr(),
            len,
            owner: Owner::Arena(arena.clone()),
        }
    }

    /// Whether the elements live in a shared arena.
    pub fn is_shared(&self) -> bool {
        matches!(self.owner, Owner::Arena(_))
    }
}

impl<T: Pod> Deref for Store<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr`/`len` describe initialised, immutable elements kept alive by
        // `owner` (see the Send/Sync note above).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Pod> Clone for Store<T> {
    fn clone(&self) -> Store<T> {
        match &self.owner {
            Owner::Vec(v) => Store::new(v.clone()),
            Owner::Arena(a) => Store {
                ptr: self.ptr,
                len: self.len,
                owner: Owner::Arena(a.clone()),
            },
        }
    }
}

impl<T: Pod> std::fmt::Debug for Store<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_shared() { "arena" } else { "own" };
        write!(f, "Store({} elements, {kind})", self.len)
    }
}

/// Moves the bulk of every weight smaller than [`OWN_FROM`] into one shared arena (each
/// range 64-byte aligned); returns the arena's size in bytes (0 when nothing moved).
pub fn share_arena(weights: &mut [&mut PackedWeight]) -> usize {
    let small = |p: &PackedWeight| p.stored().len() < OWN_FROM;
    let total: usize = weights
        .iter()
        .filter(|p| small(p))
        .map(|p| p.stored().len().next_multiple_of(64))
        .sum();
    if total == 0 {
        return 0;
    }
    let mut words = vec![0u64; total / 8];
    let mut at = 0;
    let mut offsets = vec![];
    for p in weights.iter().filter(|p| small(p)) {
        offsets.push(at);
        at += p.stored().len().next_multiple_of(64);
    }
    {
        // The copies (and the fresh arena's page faults) on every core: each weight into
        // its own range.
        let mut rest: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        let mut jobs = vec![];
        for p in weights.iter().filter(|p| small(p)) {
            let s = p.stored();
            let (dst, tail) = rest.split_at_mut(s.len().next_multiple_of(64).min(rest.len()));
            jobs.push((&mut dst[..s.len()], s));
            rest = tail;
        }
        jobs.into_par_iter().for_each(|(d, s)| d.copy_from_slice(s));
    }
    let arena = Arc::new(words);
    let mut offsets = offsets.into_iter();
    for p in weights.iter_mut().filter(|p| small(p)) {
        let Some(off) = offsets.next() else { break };
        match &mut p.data {
            Packed::F32(w) => *w = Store::in_arena(&arena, off, w.len()),
            Packed::F16(w) => *w = Store::in_arena(&arena, off, w.len()),
            Packed::Lut4 { idx, .. } => *idx = Store::in_arena(&arena, off, idx.len()),
            Packed::Int4 { q, .. } => *q = Store::in_arena(&arena, off, q.len()),
        }
    }
    total
}
