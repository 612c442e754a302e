//! Packing of sub-byte element types (uint1/2/3/4/6, int4) into bytes, as Core ML stores them
//! in `weight.bin` blobs and in immediate `bytes` values.
//!
//! Layout (checked against coremltools 9's `pack_elements_into_bits` and against the blob
//! writer `_BlobStorageWriter.write_uint{1,2,3,4,6}_data` / `write_int4_data`, which produce
//! identical bytes): the elements form one little-endian bit stream. Element `i` occupies bits
//! `[i*nbits, (i+1)*nbits)` of the stream, least significant bit first, and bit `b` of the stream
//! is bit `b % 8` of byte `b / 8`. The final byte is zero-padded, so the byte count is
//! `ceil(n * nbits / 8)`. Signed int4 stores the low 4 bits of the two's complement value.

use anyhow::{bail, Result};
use rayon::prelude::*;

/// Bit widths Core ML has sub-byte element types for (uint1..uint6; 4 also serves int4).
pub const SUBBYTE_NBITS: [u32; 5] = [1, 2, 3, 4, 6];

/// Number of bytes that `n` elements of `nbits` bits occupy once packed.
pub fn packed_len(n: usize, nbits: u32) -> usize {
    (n * nbits as usize).div_ceil(8)
}

fn check_nbits(nbits: u32) -> Result<()> {
    if !(1..=8).contains(&nbits) {
        bail!("sub-byte packing: nbits must be in 1..=8, got {nbits}");
    }
    Ok(())
}

/// Elements per parallel packing task: a multiple of 8, so that at every width a task's
/// elements fill a whole number of bytes and tasks write disjoint bytes.
const PACK_PIECE: usize = 64 * 1024;

/// Index and value of the first code `>= limit`, if any (checked in parallel: this runs over
/// whole models; the serial search only runs on failure).
fn first_at_least(codes: &[u8], limit: u32) -> Option<(usize, u8)> {
    let bad = codes
        .par_chunks(PACK_PIECE)
        .any(|c| u32::from(c.iter().copied().max().unwrap_or(0)) >= limit);
    if !bad {
        return None;
    }
    codes
        .iter()
        .copied()
        .enumerate()
        .find(|&(_, c)| u32::from(c) >= limit)
}

/// Packs unsigned codes (each `< 2^nbits`) LSB-first. Errors on a code that does not fit,
/// rather than silently dropping its high bits.
pub fn pack_bits(codes: &[u8], nbits: u32) -> Result<Vec<u8>> {
    check_nbits(nbits)?;
    if let Some((i, c)) = first_at_least(codes, 1 << nbits) {
        bail!("sub-byte packing: element {i} is {c}, which does not fit in uint{nbits}");
    }
    Ok(pack_unchecked(codes, nbits))
}

/// Packs codes, keeping only the low `nbits` bits of each, in parallel pieces.
fn pack_unchecked(codes: &[u8], nbits: u32) -> Vec<u8> {
    let mut out = vec![0u8; packed_len(codes.len(), nbits)];
    out.par_chunks_mut(PACK_PIECE / 8 * nbits as usize)
        .zip(codes.par_chunks(PACK_PIECE))
        .for_each(|(o, c)| pack_into(c, nbits, o));
    out
}

/// Packs `codes` into `out` (`packed_len(codes.len(), nbits)` bytes), keeping only the low
/// `nbits` bits of each code. The stream starts at bit 0 of `out[0]`, so a caller packing a
/// long stream piecewise splits it at multiples of 8 elements.
#[inline(always)]
pub(crate) fn pack_into(codes: &[u8], nbits: u32, out: &mut [u8]) {
    match nbits {
        8 => out[..codes.len()].copy_from_slice(codes),
        // The widths used on whole models get branch-free loops the compiler vectorizes.
        4 => {
            // Eight codes at a time in a u64: join each even byte's nibble with the next
            // byte's, then squeeze the even bytes together (no per-byte loads and shifts).
            let octets = codes.chunks_exact(8);
            let tail = octets.remainder();
            for (o, c) in out.chunks_exact_mut(4).zip(octets) {
                let mut x = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                x &= 0x0f0f_0f0f_0f0f_0f0f;
                x = (x | (x >> 4)) & 0x00ff_00ff_00ff_00ff;
                x = (x | (x >> 8)) & 0x0000_ffff_0000_ffff;
                x = (x | (x >> 16)) & 0xffff_ffff;
                o.copy_from_slice(&(x as u32).to_le_bytes());
            }
            let done = (codes.len() - tail.len()) / 2;
            for (o, p) in out[done..].iter_mut().zip(tail.chunks(2)) {
                *o = (p[0] & 0x0f) | (p.get(1).map_or(0, |c| c & 0x0f) << 4);
            }
        }
        1 | 2 => {
            let per_byte = (8 / nbits) as usize;
            let mask = ((1u16 << nbits) - 1) as u8;
            for (byte, chunk) in out.iter_mut().zip(codes.chunks(per_byte)) {
                let mut b = 0u8;
                for (j, &c) in chunk.iter().enumerate() {
                    b |= (c & mask) << (j as u32 * nbits);
                }
                *byte = b;
            }
        }
        _ => {
            // General case (3 and 6 bits): accumulate into a 32-bit window.
            let mask = (1u32 << nbits) - 1;
            let mut acc: u32 = 0;
            let mut filled: u32 = 0;
            let mut pos = 0;
            for &c in codes {
                acc |= (u32::from(c) & mask) << filled;
                filled += nbits;
                while filled >= 8 {
                    out[pos] = acc as u8;
                    pos += 1;
                    acc >>= 8;
                    filled -= 8;
                }
            }
            if filled > 0 {
                out[pos] = acc as u8;
            }
        }
    }
}

/// Unpacks `n` unsigned codes of `nbits` bits from `bytes`. Errors if `bytes` is too short.
pub fn unpack_bits(bytes: &[u8], nbits: u32, n: usize) -> Result<Vec<u8>> {
    check_nbits(nbits)?;
    let need = packed_len(n, nbits);
    if bytes.len() < need {
        bail!(
            "sub-byte unpacking: {n} uint{nbits} elements need {need} bytes, got {}",
            bytes.len()
        );
    }
    let mask = ((1u16 << nbits) - 1) as u8;
    let mut out = Vec::with_capacity(n);
    match nbits {
        8 => out.extend_from_slice(&bytes[..n]),
        1 | 2 | 4 => {
            let per_byte = (8 / nbits) as usize;
            'outer: for &b in &bytes[..need] {
                for j in 0..per_byte {
                    if out.len() == n {
                        break 'outer;
                    }
                    out.push((b >> (j as u32 * nbits)) & mask);
                }
            }
        }
        _ => {
            let mut acc: u32 = 0;
            let mut filled: u32 = 0;
            let mut it = bytes[..need].iter();
            while out.len() < n {
                while filled < nbits {
                    // `need` bytes always hold n elements, so this never runs dry.
                    let b = it.next().copied().unwrap_or(0);
                    acc |= u32::from(b) << filled;
                    filled += 8;
                }
                out.push((acc as u8) & mask);
                acc >>= nbits;
                filled -= nbits;
            }
        }
    }
    Ok(out)
}

/// Packs int4 values (each in [-8, 7]) as Core ML's `int4`: low nibble of two's complement.
pub fn pack_int4(values: &[i8]) -> Result<Vec<u8>> {
    // Shifting [-8, 7] by 8 gives [0, 15]: one unsigned bound check covers both ends.
    let shifted_ok = values
        .par_chunks(PACK_PIECE)
        .all(|c| c.iter().all(|&v| (v as u8).wrapping_add(8) < 16));
    if !shifted_ok {
        if let Some((i, &v)) = values
            .iter()
            .enumerate()
            .find(|(_, &v)| !(-8..=7).contains(&v))
        {
            bail!("int4 packing: element {i} is {v}, outside [-8, 7]");
        }
    }
    // The two's-complement bytes; packing keeps their low nibbles.
    Ok(pack_unchecked(bytemuck::cast_slice(values), 4))
}

/// Unpacks `n` int4 values, sign-extending each nibble.
pub fn unpack_int4(bytes: &[u8], n: usize) -> Result<Vec<i8>> {
    let codes = unpack_bits(bytes, 4, n)?;
    // Shift the nibble to the top and back arithmetically to sign-extend it.
    Ok(codes.into_iter().map(|c| ((c << 4) as i8) >> 4).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_checked_layout() {
        // uint4: element 0 in the low nibble.
        assert_eq!(pack_bits(&[0x1, 0x2, 0x3], 4).unwrap(), vec![0x21, 0x03]);
        // uint3: 5 = 101, 3 = 011, 7 = 111 → stream bits (LSB first) 101 110 111 → 0b11_011_101, 0b1
        assert_eq!(
            pack_bits(&[5, 3, 7], 3).unwrap(),
            vec![0b1101_1101, 0b0000_0001]
        );
        assert_eq!(pack_int4(&[-1, 7, -8]).unwrap(), vec![0x7f, 0x08]);
        assert!(pack_bits(&[4], 2).is_err());
        assert!(pack_int4(&[8]).is_err());
        assert!(unpack_bits(&[0], 6, 2).is_err());
    }

    #[test]
    fn round_trip_all_widths() {
        let mut state = 0x1234_5678u32;
        for nbits in [1u32, 2, 3, 4, 6, 8] {
            for n in [0usize, 1, 5, 8, 13, 64, 1001] {
                let codes: Vec<u8> = (0..n)
                    .map(|_| {
                        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        ((state >> 16) % (1 << nbits)) as u8
                    })
                    .collect();
                let packed = pack_bits(&codes, nbits).unwrap();
                assert_eq!(packed.len(), packed_len(n, nbits));
                assert_eq!(unpack_bits(&packed, nbits, n).unwrap(), codes);
            }
        }
        let vals: Vec<i8> = (-8..=7).chain(-8..=0).collect();
        let packed = pack_int4(&vals).unwrap();
        assert_eq!(unpack_int4(&packed, vals.len()).unwrap(), vals);
    }
}
