//! Unit tests of the GEMV inner loops: the shuffle-lookup and 4-row kernels against the
//! plain per-element loops.

use super::simd;

/// Deterministic values in [-1, 1), and 4-bit codes.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn f(&mut self) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 - 1.0
    }
    fn code(&mut self) -> u8 {
        (self.next() % 16) as u8
    }
}

fn nibbles(codes: &[u8]) -> Vec<u8> {
    super::pack_nibbles(codes)
}

/// f32 sums of k products in a different order: 1e-5 of Σ|w·x| (a few ulps a term).
fn close(a: f32, b: f32, mag: f32, what: &str) {
    assert!(
        (a - b).abs() <= 1e-5 * mag + 1e-6,
        "{what}: {a} vs {b} (magnitude {mag})"
    );
}

#[test]
fn f16_tables_only_for_exact_palettes() {
    let exact: Vec<f32> = (0..16).map(|i| i as f32 * 0.125 - 1.0).collect();
    let t = simd::f16_table(&exact).expect("fp16 values");
    let back = half::f16::from_bits(u16::from_le_bytes([t[3], t[19]]));
    assert_eq!(back.to_f32(), exact[3]);
    let mut inexact = exact.clone();
    inexact[5] = 0.1;
    assert!(simd::f16_table(&inexact).is_none(), "0.1 is no fp16 value");
}

#[test]
fn permuted_chunks_are_a_permutation() {
    let x: Vec<f32> = (0..200).map(|i| i as f32).collect();
    let mut p = simd::permute_chunks(&x);
    assert_eq!(p[192..], x[192..], "the tail stays in place");
    assert_ne!(p[..192], x[..192]);
    p.sort_by(f32::total_cmp);
    assert_eq!(p, x);
}

/// Four fp16 rows into the attention scores: SIMD against the plain loop (n with and
/// without a tail past the last 8 lanes); the same products, FMA-rounded.
#[test]
fn axpy4_matches_plain_loop() {
    let mut r = Lcg(5);
    for n in [8usize, 50, 448] {
        let w: Vec<half::f16> = (0..4 * n).map(|_| half::f16::from_f32(r.f())).collect();
        let q = [r.f(), r.f(), r.f(), r.f()];
        let s0: Vec<f32> = (0..n).map(|_| r.f()).collect();
        let mut want = s0.clone();
        simd::axpy4_f16(&w, q, &mut want, false);
        let mut got = s0.clone();
        simd::axpy4_f16(&w, q, &mut got, simd::available());
        for j in 0..n {
            let mag = s0[j].abs()
                + (0..4)
                    .map(|k| (q[k] * w[k * n + j].to_f32()).abs())
                    .sum::<f32>();
            close(got[j], want[j], mag, &format!("axpy4 n {n} at {j}"));
        }
    }
}

/// The shuffle kernels (SIMD where the CPU has it, and their portable form) against
/// the plain per-element loops, over row lengths with and without a tail.
#[test]
fn shuffle_kernels_match_plain_loops() {
    let mut r = Lcg(3);
    let simd_on = simd::available();
    for k in [64usize, 72, 200, 384, 448] {
        let codes: Vec<u8> = (0..k).map(|_| r.code()).collect();
        let row = nibbles(&codes);
        let x: Vec<f32> = (0..k).map(|_| r.f()).collect();
        let xp = simd::permute_chunks(&x);
        let pal: [f32; 16] = std::array::from_fn(|_| half::f16::from_f32(r.f()).to_f32());
        let tab = simd::f16_table(&pal).expect("fp16 palette");
        let mag: f32 = codes
            .iter()
            .zip(&x)
            .map(|(&c, v)| (pal[c as usize] * v).abs())
            .sum();
        let want = simd::dot_lut4(&row, &pal, &x, false);
        for on in [false, simd_on] {
            let mut got = [0f32];
            simd::lut4_f16_rows(&row, k, &tab, &pal, &xp, &x, &mut got, on);
            close(got[0], want, mag, &format!("lut4 k {k} simd {on}"));
        }
        let table = simd::f16_table(&super::INT4_CODES).expect("codes are fp16 values");
        for block in [32usize, 64, 96] {
            if k % block != 0 {
                continue;
            }
            let scale: Vec<f32> = (0..k / block).map(|_| r.f()).collect();
            let mag: f32 = (0..k)
                .map(|j| (scale[j / block] * codes[j] as f32 * x[j]).abs())
                .sum();
            let want = simd::dot_int4_blocks(&row, &scale, block, &x, false);
            for on in [false, simd_on] {
                let mut got = [0f32];
                simd::int4_f16_rows(&row, k, &scale, block, &table, &xp, &x, &mut got, on);
                close(
                    got[0],
                    want,
                    mag,
                    &format!("int4 k {k} block {block} simd {on}"),
                );
            }
        }
    }
}

/// Weights moved into a shared arena give bit-identical products in every storage form; a
/// weight of `store::OWN_FROM` bytes or more keeps its own allocation; clones of shared
/// weights read the same elements.
#[test]
fn shared_arena_keeps_every_product() {
    use super::{share_arena, store::OWN_FROM, PackedWeight};
    let mut r = Lcg(21);
    let (n, k) = (24, 128);
    let vals: Vec<f32> = (0..n * k).map(|_| r.f()).collect();
    let codes: Vec<u8> = (0..n * k).map(|_| r.code()).collect();
    let pal: Vec<f32> = (0..3 * 16)
        .map(|_| half::f16::from_f32(r.f()).to_f32())
        .collect();
    let nb = n * k / 32;
    let scales: Vec<f32> = (0..nb).map(|_| 0.01 + r.f().abs() * 0.1).collect();
    // Large enough to keep its own block: OWN_FROM bytes of fp16.
    let big_n = OWN_FROM / (2 * k);
    let big: Vec<half::f16> = (0..big_n * k).map(|_| half::f16::from_f32(r.f())).collect();
    let mut ws = [
        PackedWeight::from_f32(&[n, k], vals.clone()).unwrap(),
        PackedWeight::from_f16(
            &[n, k],
            vals.iter().map(|&v| half::f16::from_f32(v)).collect(),
        )
        .unwrap(),
        PackedWeight::lut4(&[n, k], &codes, pal).unwrap(),
        PackedWeight::int4(&[n, k], &codes, scales, vec![8.0; nb], 32).unwrap(),
        PackedWeight::from_f16(&[big_n, k], big).unwrap(),
    ];
    let x: Vec<f32> = (0..2 * k).map(|_| r.f()).collect();
    let before: Vec<(Vec<f32>, Vec<f32>)> = ws
        .iter()
        .map(|w| (w.gemv(&x[..k], 1).unwrap(), w.gemv(&x, 2).unwrap()))
        .collect();
    let mut refs: Vec<&mut PackedWeight> = ws.iter_mut().collect();
    let bytes = share_arena(&mut refs);
    assert_eq!(bytes, (n * k * 4) + (n * k * 2) + 2 * (n * k / 2));
    for (i, (w, b)) in ws.iter().zip(&before).enumerate() {
        let shared = match &w.data {
            super::Packed::F32(s) => s.is_shared(),
            super::Packed::F16(s) => s.is_shared(),
            super::Packed::Lut4 { idx, .. } => idx.is_shared(),
            super::Packed::Int4 { q, .. } => q.is_shared(),
        };
        assert_eq!(shared, i < 4, "weight {i} ({})", w.form());
        let again = (w.gemv(&x[..k], 1).unwrap(), w.gemv(&x, 2).unwrap());
        assert_eq!(&again, b, "weight {i} ({}) after the move", w.form());
        let c = w.clone();
        assert_eq!(c.stored(), w.stored(), "clone of weight {i}");
        assert_eq!(c.gemv(&x[..k], 1).unwrap(), b.0, "clone of weight {i}");
    }
}

/// The AVX-512 kernels (where the CPU has them) and their portable forms against the plain
/// per-element loops: fp16 rows (counts past the last group of four, lengths past the last
/// 32-element step), 4-bit code rows with one palette (LUT4) and with block scales (int4:
/// blocks of 32/64/96 and the whole row), and the attention's row-by-row fp16 update.
#[test]
fn wide_kernels_match_plain_loops() {
    use super::wide;
    let mut r = Lcg(9);
    let on = wide::available();
    for k in [32usize, 40, 60, 72, 200, 384, 1500] {
        for rows in [1usize, 4, 7] {
            let w: Vec<half::f16> = (0..rows * k).map(|_| half::f16::from_f32(r.f())).collect();
            let x: Vec<f32> = (0..k).map(|_| r.f()).collect();
            for o in [false, on] {
                let mut got = vec![0f32; rows];
                wide::f16_rows(&w, &x, &mut got, o);
                for (i, g) in got.iter().enumerate() {
                    let row = &w[i * k..(i + 1) * k];
                    let want: f32 = row.iter().zip(&x).map(|(a, b)| a.to_f32() * b).sum();
                    let mag: f32 = row
                        .iter()
                        .zip(&x)
                        .map(|(a, b)| (a.to_f32() * b).abs())
                        .sum();
                    close(
                        *g,
                        want,
                        mag,
                        &format!("f16_rows k {k} row {i}/{rows} on {o}"),
                    );
                }
            }
            let codes: Vec<u8> = (0..rows * k).map(|_| r.code()).collect();
            let packed = nibbles(&codes);
            let xp = wide::permute_pairs(&x);
            let table: [f32; 16] = std::array::from_fn(|_| r.f());
            for block in [32usize, 64, 96, k] {
                if k % block != 0 {
                    continue;
                }
                let nb = k / block;
                let scale: Vec<f32> = (0..rows * nb).map(|_| r.f()).collect();
                for scaled in [false, true] {
                    if !scaled && block != k {
                        continue;
                    }
                    let s = scaled.then_some(scale.as_slice());
                    for o in [false, on] {
                        let mut got = vec![0f32; rows];
                        wide::code_rows(&packed, k, &table, s, block, &xp, &x, &mut got, o);
                        for (i, g) in got.iter().enumerate() {
                            let term = |j: usize| {
                                let sc = if scaled {
                                    scale[i * nb + j / block]
                                } else {
                                    1.0
                                };
                                sc * table[codes[i * k + j] as usize] * x[j]
                            };
                            let want: f32 = (0..k).map(term).sum();
                            let mag: f32 = (0..k).map(|j| term(j).abs()).sum();
                            let what =
                                format!("code_rows k {k} block {block} scaled {scaled} row {i}/{rows} on {o}");
                            close(*g, want, mag, &what);
                        }
                    }
                }
            }
        }
        let n = k;
        for rows in [1usize, 4, 7] {
            let w: Vec<half::f16> = (0..rows * n).map(|_| half::f16::from_f32(r.f())).collect();
            let q: Vec<f32> = (0..rows).map(|_| r.f()).collect();
            let s0: Vec<f32> = (0..n).map(|_| r.f()).collect();
            for o in [false, on] {
                let mut got = s0.clone();
                wide::axpy_rows_f16(&w, &q, &mut got, o);
                for j in 0..n {
                    let term = |t: usize| q[t] as f64 * w[t * n + j].to_f32() as f64;
                    let want = s0[j] as f64 + (0..rows).map(term).sum::<f64>();
                    let mag = s0[j].abs() + (0..rows).map(|t| term(t).abs() as f32).sum::<f32>();
                    close(
                        got[j],
                        want as f32,
                        mag,
                        &format!("wide axpy_rows {rows} rows n {n} at {j} on {o}"),
                    );
                }
            }
        }
    }
}

/// `permute_pairs` is a permutation that leaves the tail past the last step in place.
#[test]
fn permuted_pairs_are_a_permutation() {
    let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let mut p = super::wide::permute_pairs(&x);
    assert_eq!(p[96..], x[96..], "the tail stays in place");
    assert_eq!(p[..4], [0.0, 2.0, 4.0, 6.0], "even elements first");
    assert_eq!(p[16], 1.0, "then the odd ones");
    p.sort_by(f32::total_cmp);
    assert_eq!(p, x);
}

/// The levels listed as supported are those the CPU reports, so that the tests that loop
/// over them really run the AVX-512 path where it exists.
#[test]
fn supported_levels_follow_the_cpu() {
    use super::Isa;
    let levels = Isa::supported();
    assert_eq!(levels[0], Isa::Portable);
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let avx512 =
            avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
        assert_eq!(
            levels.contains(&Isa::Avx2),
            avx2 && is_x86_feature_detected!("f16c")
        );
        assert_eq!(
            levels.contains(&Isa::Avx512),
            avx512 && is_x86_feature_detected!("f16c")
        );
        if avx512 {
            eprintln!("this CPU runs the AVX-512 kernels; they are tested");
        }
    }
    assert_eq!(*levels.last().unwrap(), Isa::best());
}

#[test]
fn nibbles_pack_low_first_and_codes_range_check_by_their_maximum() {
    // Even and odd counts: code 2j in byte j's low nibble, 2j + 1 in its high one, an odd
    // last code alone in the last byte's low nibble.
    let codes: Vec<u8> = (0..37u32).map(|i| ((i * 7 + 3) % 16) as u8).collect();
    for n in [0, 1, 2, 36, 37] {
        let got = nibbles(&codes[..n]);
        assert_eq!(got.len(), n.div_ceil(2));
        for (i, &c) in codes[..n].iter().enumerate() {
            assert_eq!((got[i / 2] >> (4 * (i % 2))) & 15, c, "{n} codes, code {i}");
        }
        if n % 2 == 1 {
            assert_eq!(got[n / 2] >> 4, 0, "{n} codes: the odd tail's high nibble");
        }
    }
    assert_eq!(super::max_code(&[]), 0);
    assert_eq!(super::max_code(&[3, 15, 0, 7]), 15);
    let mut big = vec![1u8; 1000];
    big[999] = 16;
    assert_eq!(super::max_code(&big), 16);
    // The packers refuse a code past 4 bits wherever it is.
    assert!(super::PackedWeight::lut4(&[2, 500], &big, vec![0.0; 16]).is_err());
}

/// The floor's read (`wide::read_sum`) is the wrapping sum of its words on both paths, for
/// lengths that are whole 256-byte steps, that leave a rest, and that have no step at all.
#[test]
fn the_stream_read_sums_every_word() {
    use super::wide;
    let mut r = Lcg(5);
    for n in [0usize, 1, 31, 32, 33, 64, 95, 1000, 4096 + 17] {
        let words: Vec<u64> = (0..n)
            .map(|_| ((r.code() as u64) << 60) | (r.code() as u64 * 0x0101_0101) | n as u64)
            .collect();
        let want = words.iter().fold(0u64, |a, &x| a.wrapping_add(x));
        for on in [false, wide::available()] {
            assert_eq!(wide::read_sum(&words, on), want, "{n} words, on {on}");
        }
    }
}

/// The fp16 row kernel sums each row alone, whatever rows share its call (it reads two at
/// a time, one from each half of the range, and an odd count leaves one alone): every row
/// of a call over 1 to 9 rows has the bits of that row computed by itself.
#[test]
fn fp16_rows_sum_each_row_with_the_bits_of_that_row_alone() {
    use super::wide;
    let mut r = Lcg(77);
    for k in [40usize, 384, 1500] {
        for rows in 1..=9 {
            let w: Vec<half::f16> = (0..rows * k).map(|_| half::f16::from_f32(r.f())).collect();
            let x: Vec<f32> = (0..k).map(|_| r.f()).collect();
            for on in [false, wide::available()] {
                let mut all = vec![0f32; rows];
                wide::f16_rows(&w, &x, &mut all, on);
                for (i, g) in all.iter().enumerate() {
                    let mut one = [0f32];
                    wide::f16_rows(&w[i * k..(i + 1) * k], &x, &mut one, on);
                    assert_eq!(
                        g.to_bits(),
                        one[0].to_bits(),
                        "k {k} row {i} of {rows} on {on}"
                    );
                }
            }
        }
    }
}

/// `axpy_rows_f16` over many rows (four a sweep or row after row on AVX-512) gives the bits
/// of adding the rows one call at a time, for row counts around the block of four and sums whose length
/// ends in a masked tail.
#[test]
fn axpy_rows_over_many_rows_matches_one_row_at_a_time_bit_for_bit() {
    use super::wide;
    let mut r = Lcg(57);
    for n in [16usize, 37, 64, 1500] {
        for rows in 1..=9 {
            let w: Vec<half::f16> = (0..rows * n).map(|_| half::f16::from_f32(r.f())).collect();
            let q: Vec<f32> = (0..rows).map(|_| r.f()).collect();
            let s0: Vec<f32> = (0..n).map(|_| r.f()).collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for on in [false, wide::available()] {
                let (mut got, mut want) = (s0.clone(), s0.clone());
                wide::axpy_rows_f16(&w, &q, &mut got, on);
                for t in 0..rows {
                    wide::axpy_rows_f16(&w[t * n..(t + 1) * n], &q[t..t + 1], &mut want, on);
                }
                assert_eq!(bits(&got), bits(&want), "n {n} rows {rows} on {on}");
            }
            if wide::available() {
                // Both sweeps, whichever this CPU takes.
                let (mut step, mut each) = (s0.clone(), s0.clone());
                wide::axpy_rows_f16_sweep(&w, &q, &mut step, true);
                wide::axpy_rows_f16_sweep(&w, &q, &mut each, false);
                assert_eq!(bits(&step), bits(&each), "n {n} rows {rows}, four a sweep");
            }
        }
    }
}

/// A patched column gives the bits of the same kernel over rows with that column replaced:
/// the column in either half of a 32-element step, in the tail after the last step, and on
/// both the AVX-512 and the portable paths.
#[test]
fn patched_row_kernels_match_the_rows_with_the_column_replaced_bit_for_bit() {
    use super::wide::{self, Patch};
    let mut r = Lcg(31);
    let h = |x: f32| half::f16::from_f32(x);
    for (n, rows) in [
        (32usize, 6),
        (45, 7),
        (96, 6),
        (448, 7),
        (1500, 6),
        (1500, 7),
    ] {
        let w: Vec<half::f16> = (0..rows * n).map(|_| h(r.f())).collect();
        let vals: Vec<half::f16> = (0..rows).map(|_| h(r.f() * 4.0)).collect();
        let x: Vec<f32> = (0..n).map(|_| r.f()).collect();
        let q: Vec<f32> = (0..rows).map(|_| r.f()).collect();
        for col in [0, 5, 16, 31, n - 1] {
            let mut replaced = w.clone();
            for (i, v) in vals.iter().enumerate() {
                replaced[i * n + col] = *v;
            }
            let patch = Some(Patch { col, vals: &vals });
            for on in [false, wide::available()] {
                let (mut got, mut want) = (vec![0f32; rows], vec![0f32; rows]);
                wide::f16_rows_patched(&w, &x, &mut got, patch, on);
                wide::f16_rows(&replaced, &x, &mut want, on);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "f16_rows n {n} col {col} on {on}");
                let s0: Vec<f32> = (0..n).map(|_| r.f()).collect();
                let (mut got, mut want) = (s0.clone(), s0);
                wide::axpy_rows_f16_patched(&w, &q, &mut got, patch, on);
                wide::axpy_rows_f16(&replaced, &q, &mut want, on);
                assert_eq!(bits(&got), bits(&want), "axpy_rows n {n} col {col} on {on}");
            }
        }
    }
}
