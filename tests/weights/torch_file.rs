//! Writers for a PyTorch `torch.save` checkpoint (a zip of stored entries holding a protocol-2
//! pickle and raw storages), built by hand because no Python with torch is available here.

use std::path::Path;

/// CRC-32 (IEEE), as zip stores it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A zip archive of stored (uncompressed) entries.
pub fn write_zip(path: &Path, entries: &[(String, Vec<u8>)]) {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    let u16le = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
    let u32le = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    for (name, data) in entries {
        let (offset, crc, len) = (out.len() as u32, crc32(data), data.len() as u32);
        u32le(&mut out, 0x0403_4b50);
        for x in [20u16, 0, 0, 0, 0x21] {
            u16le(&mut out, x); // version, flags, stored, time, date 1980-01-01
        }
        for x in [crc, len, len] {
            u32le(&mut out, x);
        }
        u16le(&mut out, name.len() as u16);
        u16le(&mut out, 0);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);

        u32le(&mut central, 0x0201_4b50);
        for x in [20u16, 20, 0, 0, 0, 0x21] {
            u16le(&mut central, x);
        }
        for x in [crc, len, len] {
            u32le(&mut central, x);
        }
        for x in [name.len() as u16, 0, 0, 0, 0] {
            u16le(&mut central, x);
        }
        u32le(&mut central, 0);
        u32le(&mut central, offset);
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    u32le(&mut out, 0x0605_4b50);
    for x in [0u16, 0, entries.len() as u16, entries.len() as u16] {
        u16le(&mut out, x);
    }
    u32le(&mut out, central.len() as u32);
    u32le(&mut out, cd_offset);
    u16le(&mut out, 0);
    std::fs::write(path, out).unwrap();
}

/// One state-dict entry: a view of `shape` at element `offset` into storage `key`.
pub struct Pickled {
    pub name: String,
    pub class: &'static str,
    pub key: String,
    pub numel: usize,
    pub offset: usize,
    pub shape: Vec<usize>,
}

/// Pickle (protocol 2) of an OrderedDict of `torch._utils._rebuild_tensor_v2` calls, the
/// way `torch.save(state_dict)` writes it.
pub fn state_dict_pickle(tensors: &[Pickled]) -> Vec<u8> {
    let mut p = vec![0x80, 2];
    let global = |p: &mut Vec<u8>, m: &str, c: &str| {
        p.push(b'c');
        p.extend_from_slice(format!("{m}\n{c}\n").as_bytes());
    };
    let unicode = |p: &mut Vec<u8>, s: &str| {
        p.push(b'X');
        p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        p.extend_from_slice(s.as_bytes());
    };
    let int = |p: &mut Vec<u8>, v: usize| {
        p.push(b'J');
        p.extend_from_slice(&(v as i32).to_le_bytes());
    };
    global(&mut p, "collections", "OrderedDict");
    p.extend_from_slice(b")R(");
    for Pickled {
        name,
        class,
        key,
        numel,
        offset,
        shape,
    } in tensors
    {
        unicode(&mut p, name);
        global(&mut p, "torch._utils", "_rebuild_tensor_v2");
        p.extend_from_slice(b"((");
        unicode(&mut p, "storage");
        global(&mut p, "torch", class);
        unicode(&mut p, key);
        unicode(&mut p, "cpu");
        int(&mut p, *numel);
        p.extend_from_slice(b"tQ");
        int(&mut p, *offset);
        p.push(b'(');
        for &s in shape {
            int(&mut p, s);
        }
        p.extend_from_slice(b"t(");
        let mut stride = 1;
        let mut strides = vec![0; shape.len()];
        for (i, &s) in shape.iter().enumerate().rev() {
            strides[i] = stride;
            stride *= s;
        }
        for s in strides {
            int(&mut p, s);
        }
        p.extend_from_slice(b"t\x89");
        global(&mut p, "collections", "OrderedDict");
        p.extend_from_slice(b")RtR");
    }
    p.extend_from_slice(b"u.");
    p
}

#[test]
fn crc32_matches_the_standard_check_value() {
    assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
}
