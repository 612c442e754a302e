//! `milkit::alloc::HugePageHint`, installed here as the `milkit` binary installs it: large
//! blocks keep their contents through alloc / zeroed alloc / realloc, and on Linux with
//! transparent huge pages granted on request (`madvise`) or always, a large block's pages
//! become huge pages — which without the hint they do not in `madvise` mode.

#[global_allocator]
static ALLOC: milkit::alloc::HugePageHint = milkit::alloc::HugePageHint;

/// Bytes of the process's anonymous memory on huge pages.
fn anon_huge_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = s.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The kernel's THP mode (`always`, `madvise` or `never`), when it says.
fn thp_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = s.find('[')?;
    let end = s[start..].find(']')?;
    Some(s[start + 1..start + end].to_string())
}

#[test]
fn large_blocks_keep_their_contents() {
    let n = 3 << 20; // u32s: 12 MiB
    let mut v: Vec<u32> = (0..n as u32).collect();
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
    v.resize(2 * n, 7);
    assert!(v[..n].iter().enumerate().all(|(i, &x)| x == i as u32));
    assert!(v[n..].iter().all(|&x| x == 7));
    let z = vec![0u64; 1 << 20];
    assert!(z.iter().all(|&x| x == 0));
    let small: Vec<u8> = (0..100).collect();
    assert_eq!(small.iter().map(|&x| x as u32).sum::<u32>(), 4950);
}

#[test]
fn large_blocks_get_huge_pages_when_the_kernel_grants_them() {
    let mode = thp_mode();
    let (Some(mode), Some(before)) = (mode, anon_huge_kb()) else {
        eprintln!("skipping: no transparent huge page information on this system");
        return;
    };
    if mode == "never" {
        eprintln!("skipping: transparent huge pages are off (`never`)");
        return;
    }
    // 64 MiB written once; at least part of it must be backed by 2 MiB pages.
    let v: Vec<u64> = (0..8u64 << 20).collect();
    let after = anon_huge_kb().unwrap_or(0);
    assert_eq!(v[12345], 12345);
    assert!(
        after >= before + 2048,
        "THP mode `{mode}`: AnonHugePages {before} kB → {after} kB after a 64 MiB block"
    );
}
