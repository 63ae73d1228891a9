//! The `sluice` command: picks the allocator and its memory settings, then hands off to the
//! library.

mod cli;

// The store and serde allocate on every write; with mimalloc `sluice bench submit` measured 7.4k
// durable submissions/s at 256 clients against 6.1k with glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    disable_transparent_huge_pages();
    // Fail points named in FAILPOINTS take effect; in builds without the feature there are none.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    cli::main()
}

/// mimalloc asks the kernel for transparent huge pages on its arenas, so the first touch of
/// each 2 MiB page zeroes all of it, on whichever thread touched it; mimalloc hands memory back
/// to the kernel after a second idle, and the next touch zeroes it again. At 10,500 tasks/s
/// that zeroing was 11 % of both cores (`perf`, `clear_page_erms`), taken in bursts on the
/// writer and the request threads. With huge pages off for this process it is 2 %; in four
/// `sluice bench e2e --rate 10500` runs each, claims within 5 ms at the workers went from
/// 93.8–97.6 % to 96.9–98.8 %, and the server's resident memory after them from ~510 to
/// ~345 MB. It is what `MIMALLOC_ALLOW_THP=0` does, and leaves the system's setting alone.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes plain integers and touches no memory of ours; it
    // fails only on kernels without it, and then nothing changes.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
