//! Host tensors in and out of files for `milkit run`: NumPy `.npy` (f32, f16, i32, plus
//! f64, i64, u8 and bool on read) and one tensor of a `.safetensors` file, addressed as
//! `file.safetensors:name`. Headers are validated before any data is touched.

use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use std::path::Path;

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

fn npy_descr(d: DType) -> Result<&'static str> {
    Ok(match d {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::F64 => "<f8",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        d => bail!("cannot write {d:?} tensors to .npy"),
    })
}

/// Writes a tensor as a C-order `.npy` file (format 1.0).
pub fn write_npy(path: &Path, t: &Tensor) -> Result<()> {
    let descr = npy_descr(t.dtype())?;
    let shape: Vec<String> = t.dims().iter().map(|d| d.to_string()).collect();
    let shape = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header, padded with spaces to 64, ending in \n.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = Vec::with_capacity(total + t.elem_count() * t.dtype().size_in_bytes());
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    let t = t.flatten_all()?;
    match t.dtype() {
        DType::F32 => t
            .to_vec1::<f32>()?
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => t
            .to_vec1::<f16>()?
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::I32 => t
            .to_vec1::<i32>()?
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F64 => t
            .to_vec1::<f64>()?
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::I64 => t
            .to_vec1::<i64>()?
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::U8 => out.extend_from_slice(&t.to_vec1::<u8>()?),
        d => bail!("cannot write {d:?} tensors to .npy"),
    }
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// Value of `'key': value` in a .npy header dict (a quoted string, a bool or a tuple).
fn header_field<'a>(h: &'a str, key: &str) -> Result<&'a str> {
    let k = format!("'{key}'");
    let i = h.find(&k).ok_or_else(|| anyhow!("header lacks {k}"))?;
    let rest = h[i + k.len()..]
        .trim_start()
        .strip_prefix(':')
        .ok_or_else(|| anyhow!("malformed {k}"))?
        .trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|e| e + 1)
    } else if let Some(r) = rest.strip_prefix('\'') {
        r.find('\'').map(|e| e + 2)
    } else {
        rest.find([',', '}'])
    };
    Ok(&rest[..end.ok_or_else(|| anyhow!("malformed {k}"))?])
}

/// Reads a C-order `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let b = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_npy(&b).with_context(|| format!("{}: not a supported .npy file", path.display()))
}

fn parse_npy(b: &[u8]) -> Result<Tensor> {
    ensure!(b.len() >= 10 && &b[..6] == NPY_MAGIC, "bad magic");
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 => {
            ensure!(b.len() >= 12, "truncated header");
            (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
        }
        v => bail!("unsupported .npy version {v}"),
    };
    ensure!(b.len() >= start + hlen, "truncated header");
    let h =
        std::str::from_utf8(&b[start..start + hlen]).map_err(|_| anyhow!("header is not text"))?;
    let descr = header_field(h, "descr")?.trim_matches('\'');
    ensure!(
        header_field(h, "fortran_order")? == "False",
        "Fortran-order arrays are not supported"
    );
    let shape_s = header_field(h, "shape")?.trim_matches(|c| c == '(' || c == ')');
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| anyhow!("bad shape entry `{s}`"))
        })
        .collect::<Result<_>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| anyhow!("shape {shape:?} overflows"))?;
    let data = &b[start + hlen..];
    let width = match descr {
        "<f4" | "<i4" => 4,
        "<f2" => 2,
        "<f8" | "<i8" => 8,
        "|u1" | "|b1" | "<u1" => 1,
        d => bail!("unsupported dtype `{d}` (f4, f2, f8, i4, i8, u1, b1 little-endian)"),
    };
    ensure!(
        n.checked_mul(width) == Some(data.len()),
        "{} data bytes for {n} elements of {descr}",
        data.len()
    );
    let dev = &Device::Cpu;
    let t = match descr {
        "<f4" => Tensor::from_vec(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        "<i4" => Tensor::from_vec(
            data.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        "<f2" => Tensor::from_vec(
            data.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        "<f8" => Tensor::from_vec(
            data.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        "<i8" => Tensor::from_vec(
            data.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        _ => Tensor::from_vec(
            data.iter()
                .map(|&v| if descr == "|b1" { (v != 0) as u8 } else { v })
                .collect::<Vec<u8>>(),
            shape,
            dev,
        )?,
    };
    Ok(t)
}

/// Reads tensor `name` from a `.safetensors` file (header validated by the safetensors
/// crate: offsets in range, no overlap).
pub fn read_safetensors(path: &Path, name: &str) -> Result<Tensor> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{}: not a safetensors file", path.display()))?;
    let v = st.tensor(name).map_err(|_| {
        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        anyhow!(
            "{} has no tensor `{name}` (has: {})",
            path.display(),
            names.join(", ")
        )
    })?;
    let (b, shape, dev) = (v.data(), v.shape().to_vec(), &Device::Cpu);
    use safetensors::Dtype as S;
    let t = match v.dtype() {
        S::F32 => Tensor::from_vec(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        S::F16 => Tensor::from_vec(
            b.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        S::BF16 => Tensor::from_vec(
            b.chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        S::I32 => Tensor::from_vec(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        S::I64 => Tensor::from_vec(
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        S::F64 => Tensor::from_vec(
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect::<Vec<_>>(),
            shape,
            dev,
        )?,
        S::U8 | S::BOOL => Tensor::from_vec(b.to_vec(), shape, dev)?,
        d => bail!(
            "{}: tensor `{name}` has unsupported dtype {d:?}",
            path.display()
        ),
    };
    Ok(t)
}

/// Reads a tensor addressed as `file.npy` or `file.safetensors:name`.
pub fn read_tensor(spec: &str) -> Result<Tensor> {
    if let Some((file, name)) = spec.rsplit_once(':') {
        if file.ends_with(".safetensors") {
            return read_safetensors(Path::new(file), name);
        }
    }
    if spec.ends_with(".safetensors") {
        bail!("`{spec}`: name the tensor as FILE.safetensors:NAME");
    }
    read_npy(Path::new(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip_all_written_dtypes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let base = Tensor::from_vec(
            (0..24).map(|i| i as f32 - 7.5).collect::<Vec<_>>(),
            (2, 3, 4),
            &Device::Cpu,
        )
        .unwrap();
        for d in [DType::F32, DType::F16, DType::I32] {
            let t = base.to_dtype(d).unwrap();
            write_npy(&p, &t).unwrap();
            let r = read_npy(&p).unwrap();
            assert_eq!(r.dtype(), d);
            assert_eq!(r.dims(), &[2, 3, 4]);
            let (a, b) = (
                t.to_dtype(DType::F64).unwrap(),
                r.to_dtype(DType::F64).unwrap(),
            );
            assert_eq!(
                a.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f64>().unwrap()
            );
        }
        // Header is 64-aligned, as numpy writes it.
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(
            (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
            0
        );
    }

    #[test]
    fn npy_rejects_bad_files() {
        assert!(parse_npy(b"hello").is_err());
        let mut b = NPY_MAGIC.to_vec();
        b.extend_from_slice(&[1, 0]);
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n";
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[0; 8]); // 8 bytes for 3 floats
        assert!(parse_npy(&b).is_err());
    }
}
