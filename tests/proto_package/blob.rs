//! MIL blob storage v2: round trips, byte identity with coremltools' writer, refusals.

use milkit::package::blob::{
    pack_i4, pack_sub_byte, unpack_i4, unpack_sub_byte, BlobDType, BlobReader, BlobWriter,
};

/// Test case: a dtype and its element values as integers (raw bits for floats).
struct Case {
    dtype: BlobDType,
    values: Vec<i64>,
}

/// Deterministic pseudo-random values that fit `dtype`.
fn values(dtype: BlobDType, n: usize, seed: u64) -> Vec<i64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bits = dtype.bits();
            let raw = (x & ((1u64 << bits) - 1)) as i64;
            match dtype {
                BlobDType::I4 => raw - 8,
                BlobDType::I8 => raw - 128,
                BlobDType::I16 => raw - 32768,
                BlobDType::I32 => raw - (1 << 31),
                // Finite floats only, so Python round-trips the bits exactly.
                BlobDType::F32 => raw & 0x3fff_ffff,
                BlobDType::F16 => raw & 0x3bff,
                _ => raw,
            }
        })
        .collect()
}

/// Little-endian bytes (packed for sub-byte dtypes) of a case.
fn encode(c: &Case) -> Vec<u8> {
    match c.dtype {
        BlobDType::I4 => pack_i4(&c.values.iter().map(|&v| v as i8).collect::<Vec<_>>()).unwrap(),
        d if d.is_sub_byte() => {
            pack_sub_byte(d, &c.values.iter().map(|&v| v as u8).collect::<Vec<_>>()).unwrap()
        }
        d => {
            let w = (d.bits() / 8) as usize;
            c.values
                .iter()
                .flat_map(|&v| v.to_le_bytes()[..w].to_vec())
                .collect()
        }
    }
}

fn append(w: &mut BlobWriter<impl std::io::Write + std::io::Seek>, c: &Case) -> u64 {
    let bytes = encode(c);
    if c.dtype.is_sub_byte() {
        w.append_sub_byte(c.dtype, c.values.len() as u64, &bytes)
            .unwrap()
    } else {
        w.append(c.dtype, &bytes).unwrap()
    }
}

/// Cases for the dtypes coremltools' Python writer supports (all but BF16 and FP8), with
/// lengths that exercise every padding amount, empty blobs and a multi-KB blob.
fn python_cases() -> Vec<Case> {
    use BlobDType::*;
    let mut cases = vec![
        Case {
            dtype: U4,
            values: vec![1, 2, 3],
        },
        Case {
            dtype: I4,
            values: vec![-1, 2, -3],
        },
    ];
    for (i, d) in [F16, F32, U8, I8, I16, U16, I4, U1, U2, U4, U3, U6, I32, U32]
        .into_iter()
        .enumerate()
    {
        for n in [1usize, 5, 7, 64, 1001] {
            cases.push(Case {
                dtype: d,
                values: values(d, n, (i * 31 + n) as u64),
            });
        }
    }
    cases.push(Case {
        dtype: F16,
        values: vec![],
    });
    cases.push(Case {
        dtype: U4,
        values: vec![],
    });
    cases.push(Case {
        dtype: F32,
        values: values(F32, 3, 99),
    });
    cases
}

#[test]
fn dtype_codes_are_apples() {
    let codes: Vec<(BlobDType, u32)> = BlobDType::ALL.iter().map(|&d| (d, d.code())).collect();
    use BlobDType::*;
    // Apple's MILBlob BlobDataType enum.
    let expected = [
        (F16, 1),
        (F32, 2),
        (U8, 3),
        (I8, 4),
        (BF16, 5),
        (I16, 6),
        (U16, 7),
        (I4, 8),
        (U1, 9),
        (U2, 10),
        (U4, 11),
        (U3, 12),
        (U6, 13),
        (I32, 14),
        (U32, 15),
        (F8E4M3FN, 16),
        (F8E5M2, 17),
    ];
    assert_eq!(codes, expected);
    for d in BlobDType::ALL {
        assert_eq!(BlobDType::from_code(d.code()), Some(d));
    }
    assert_eq!(BlobDType::from_code(0), None);
    assert_eq!(BlobDType::from_code(18), None);
}

/// A bit-by-bit packer written from the documented rule (element i at bits i*b.., LSB first).
fn naive_pack(bits: usize, codes: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; (codes.len() * bits).div_ceil(8)];
    for (i, &c) in codes.iter().enumerate() {
        for k in 0..bits {
            if c >> k & 1 == 1 {
                let bit = i * bits + k;
                out[bit / 8] |= 1 << (bit % 8);
            }
        }
    }
    out
}

#[test]
fn sub_byte_packing_matches_the_documented_bit_order() {
    for d in BlobDType::ALL.into_iter().filter(|d| d.is_sub_byte()) {
        for n in [0usize, 1, 2, 3, 7, 8, 9, 100] {
            let codes: Vec<u8> = values(d, n, n as u64 + 5)
                .iter()
                .map(|&v| (v as u8) & ((1 << d.bits()) - 1))
                .collect();
            let packed = pack_sub_byte(d, &codes).unwrap();
            assert_eq!(packed, naive_pack(d.bits() as usize, &codes), "{d:?} n={n}");
            assert_eq!(packed.len() as u64, d.byte_len(n as u64).unwrap());
            assert_eq!(unpack_sub_byte(d, &packed, n).unwrap(), codes);
            assert_eq!(
                (packed.len() as u64 * 8 - d.padding_bits(n as u64)) / d.bits() as u64,
                n as u64
            );
        }
    }
    let v = [-8i8, -1, 0, 1, 7, -3, 2];
    assert_eq!(unpack_i4(&pack_i4(&v).unwrap(), v.len()).unwrap(), v);
    assert!(pack_i4(&[8]).is_err());
    assert!(pack_sub_byte(BlobDType::U3, &[8]).is_err());
    assert!(pack_sub_byte(BlobDType::U8, &[1]).is_err());
}

#[test]
fn round_trip_every_dtype_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weight.bin");
    let mut cases = python_cases();
    for (i, d) in [BlobDType::BF16, BlobDType::F8E4M3FN, BlobDType::F8E5M2]
        .into_iter()
        .enumerate()
    {
        cases.push(Case {
            dtype: d,
            values: values(d, 33, i as u64),
        });
    }
    let mut w = BlobWriter::create(&path).unwrap();
    let offsets: Vec<u64> = cases.iter().map(|c| append(&mut w, c)).collect();
    assert_eq!(w.count() as usize, cases.len());
    let (_, len) = w.finish().unwrap();
    assert_eq!(len, std::fs::metadata(&path).unwrap().len());

    // The in-memory writer produces the same bytes.
    let mut m = BlobWriter::new();
    for c in &cases {
        append(&mut m, c);
    }
    let (cursor, _) = m.finish().unwrap();
    assert_eq!(cursor.into_inner(), std::fs::read(&path).unwrap());

    let r = BlobReader::open(&path).unwrap();
    assert_eq!(r.count() as usize, cases.len());
    assert_eq!(r.offsets().unwrap(), offsets);
    for (c, &off) in cases.iter().zip(&offsets) {
        assert_eq!(off % 64, 0);
        let b = r.read_blob(off).unwrap();
        assert_eq!(b.dtype, c.dtype);
        assert_eq!(
            b.data.as_slice(),
            encode(c).as_slice(),
            "{:?} at {off}",
            c.dtype
        );
        assert_eq!(b.num_elements(), c.values.len() as u64);
        let (d, bytes) = r.read(off).unwrap();
        assert_eq!((d, bytes.len()), (c.dtype, b.data.len()));
    }
}

#[test]
fn writer_rejects_inconsistent_input() {
    let mut w = BlobWriter::new();
    assert!(w.append(BlobDType::F16, &[1, 2, 3]).is_err());
    assert!(w.append(BlobDType::U4, &[1]).is_err());
    assert!(w.append_sub_byte(BlobDType::U4, 3, &[1]).is_err());
    assert!(w.append_sub_byte(BlobDType::U8, 1, &[1]).is_err());
    assert_eq!(w.count(), 0);
}

const PY_WRITE: &str = r#"
import json, sys
import numpy as np
from coremltools.libmilstoragepython import _BlobStorageWriter, _BlobStorageReader
spec = json.load(open(sys.argv[1]))
np_types = {"F16": np.uint16, "F32": np.uint32, "U8": np.uint8, "I8": np.int8,
            "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32,
            "I4": np.int8, "U1": np.uint8, "U2": np.uint8, "U3": np.uint8, "U4": np.uint8,
            "U6": np.uint8}
method = {"F16": "fp16", "F32": "float", "U8": "uint8", "I8": "int8", "I16": "int16",
          "U16": "uint16", "I32": "int32", "U32": "uint32", "I4": "int4", "U1": "uint1",
          "U2": "uint2", "U3": "uint3", "U4": "uint4", "U6": "uint6"}
w = _BlobStorageWriter(sys.argv[2])
offsets = []
for d, vals in spec:
    a = np.array(vals, dtype=np.int64).astype(np_types[d])
    if d == "F32":
        a = a.view(np.float32)
    offsets.append(getattr(w, "write_%s_data" % method[d])(a))
del w
print(json.dumps(offsets))
"#;

#[test]
fn writer_is_byte_identical_to_coremltools() {
    let Some(py) = crate::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cases = python_cases();
    let spec: Vec<(String, &Vec<i64>)> = cases
        .iter()
        .map(|c| (format!("{:?}", c.dtype), &c.values))
        .collect();
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, serde_json::to_string(&spec).unwrap()).unwrap();
    let ref_path = dir.path().join("reference.bin");
    let out = crate::run_python(
        &py,
        PY_WRITE,
        &[spec_path.as_os_str(), ref_path.as_os_str()],
    );
    let py_offsets: Vec<u64> = serde_json::from_str(out.trim()).unwrap();

    let ours = dir.path().join("ours.bin");
    let mut w = BlobWriter::create(&ours).unwrap();
    let offsets: Vec<u64> = cases.iter().map(|c| append(&mut w, c)).collect();
    w.finish().unwrap();
    assert_eq!(offsets, py_offsets);
    let (a, b) = (
        std::fs::read(&ours).unwrap(),
        std::fs::read(&ref_path).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!(
            "first difference at byte {i}: ours {:#04x}, coremltools {:#04x}",
            a[i], b[i]
        );
    }
}

#[test]
fn reads_coremltools_weight_files() {
    let Some(fx) = crate::fixtures() else { return };
    for pkg in crate::fixture_packages(&fx) {
        let path = pkg.join("Data/com.apple.CoreML/weights/weight.bin");
        let r = BlobReader::open(&path).unwrap();
        let offsets = r.offsets().unwrap();
        assert_eq!(offsets.len(), r.count() as usize);
        assert!(
            r.count() > 60,
            "{}: only {} blobs",
            path.display(),
            r.count()
        );
        let mut end = 0;
        for &o in &offsets {
            let b = r.read_blob(o).unwrap();
            assert!(matches!(
                b.dtype,
                BlobDType::F16 | BlobDType::I4 | BlobDType::U4
            ));
            end = o + 64 + b.data.len() as u64;
        }
        // The file ends right after the last blob's data.
        assert_eq!(end, std::fs::metadata(&path).unwrap().len());
    }
}

/// A valid one-blob file (F16, 4 elements at data offset 128) to corrupt.
fn valid_file() -> Vec<u8> {
    let mut w = BlobWriter::new();
    w.append(BlobDType::F16, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    w.append_sub_byte(BlobDType::U4, 3, &[0x21, 0x03]).unwrap();
    w.finish().unwrap().0.into_inner()
}

fn open_err(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad-weight.bin");
    std::fs::write(&p, bytes).unwrap();
    format!(
        "{:#}",
        BlobReader::open(&p).err().expect("open should fail")
    )
}

fn read_err(bytes: &[u8], offset: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad-weight.bin");
    std::fs::write(&p, bytes).unwrap();
    let r = BlobReader::open(&p).unwrap();
    let e = format!("{:#}", r.read_blob(offset).expect_err("read should fail"));
    assert!(
        e.contains("bad-weight.bin"),
        "error does not name the file: {e}"
    );
    assert!(
        e.contains(&format!("offset {offset}")),
        "error does not name the offset: {e}"
    );
    e
}

fn patch(mut b: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
    b[at..at + bytes.len()].copy_from_slice(bytes);
    b
}

#[test]
fn reader_refuses_bad_files() {
    let good = valid_file();
    assert_eq!(good.len(), 256 + 2);
    let e = open_err(&good[..10]);
    assert!(
        e.contains("bad-weight.bin") && e.contains("too short"),
        "{e}"
    );
    let e = open_err(&[]);
    assert!(e.contains("too short"), "{e}");
    let e = open_err(&patch(good.clone(), 4, &1u32.to_le_bytes()));
    assert!(
        e.contains("bad-weight.bin") && e.contains("version 1"),
        "{e}"
    );
    assert!(open_err(&patch(good.clone(), 4, &3u32.to_le_bytes())).contains("version 3"));
}

#[test]
fn reader_refuses_bad_records() {
    let good = valid_file();
    // Offsets: inside the header, unaligned, past the end, record cut short by EOF.
    assert!(read_err(&good, 0).contains("header"));
    assert!(read_err(&good, 65).contains("multiple of 64"));
    assert!(read_err(&good, 1 << 20).contains("past the end"));
    assert!(read_err(&good[..150], 128).contains("past the end"));
    assert!(read_err(&good, u64::MAX - 63).contains("past the end"));
    // Sentinel.
    assert!(read_err(&patch(good.clone(), 64, &[0, 0, 0, 0]), 64).contains("sentinel"));
    // Data of the first blob read as a record: no sentinel there.
    assert!(read_err(&good, 128).contains("sentinel"));
    // Unknown dtype codes.
    for code in [0u32, 18, 0xffff_ffff] {
        let e = read_err(&patch(good.clone(), 68, &code.to_le_bytes()), 64);
        assert!(e.contains(&format!("dtype code {code}")), "{e}");
    }
    // Sizes and data offsets out of range or overlapping header/record.
    assert!(
        read_err(&patch(good.clone(), 72, &1000u64.to_le_bytes()), 64).contains("past the end")
    );
    assert!(
        read_err(&patch(good.clone(), 72, &u64::MAX.to_le_bytes()), 64).contains("past the end")
    );
    for data_offset in [0u64, 32, 64, 100] {
        let e = read_err(&patch(good.clone(), 80, &data_offset.to_le_bytes()), 64);
        assert!(e.contains("overlaps"), "{e}");
    }
    assert!(
        read_err(&patch(good.clone(), 80, &(u64::MAX - 1).to_le_bytes()), 64)
            .contains("past the end")
    );
    // Whole-byte dtype with a size that is not a whole number of elements.
    assert!(read_err(&patch(good.clone(), 72, &7u64.to_le_bytes()), 64).contains("whole number"));
    // Sub-byte blob (record at 192): padding of 8+ bits, or inconsistent with the width.
    assert!(read_err(&patch(good.clone(), 192 + 24, &8u64.to_le_bytes()), 192).contains("padding"));
    let odd = patch(good.clone(), 192 + 24, &3u64.to_le_bytes());
    assert!(read_err(&odd, 192).contains("whole number"));
    let empty_padded = patch(
        patch(good.clone(), 192 + 8, &0u64.to_le_bytes()),
        192 + 24,
        &1u64.to_le_bytes(),
    );
    assert!(read_err(&empty_padded, 192).contains("padding"));
    // And the unpatched file reads fine.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.bin");
    std::fs::write(&p, &good).unwrap();
    let r = BlobReader::open(&p).unwrap();
    assert_eq!(r.offsets().unwrap(), vec![64, 192]);
    assert_eq!(r.read_blob(192).unwrap().num_elements(), 3);
    // A header that claims more blobs than exist fails the walk, naming the offset.
    std::fs::write(&p, patch(good, 0, &3u32.to_le_bytes())).unwrap();
    let e = format!("{:#}", BlobReader::open(&p).unwrap().offsets().unwrap_err());
    assert!(e.contains("offset 320"), "{e}");
}

#[test]
fn empty_storage_is_just_a_header() {
    let (c, len) = BlobWriter::new().finish().unwrap();
    assert_eq!(len, 64);
    let b = c.into_inner();
    assert_eq!(&b[..8], &[0, 0, 0, 0, 2, 0, 0, 0]);
    assert!(b[8..].iter().all(|&x| x == 0));
}
