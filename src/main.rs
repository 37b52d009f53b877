// candle allocates a fresh buffer for every op output. With glibc malloc, or mimalloc's
// default of returning freed memory to the OS after 10 ms, a training step keeps
// faulting in gigabytes of fresh pages: `concord bench train` on the 0.5B shape took
// 48.8 s; keeping freed memory (purge delay -1) and asking for 2 MiB pages brings it to
// about 32 s. Peak RSS is unchanged: the memory is reused, not grown.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (v2 option index; not exported by the sys crate).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() {
    // SAFETY: plain option setters, called before any thread is spawned.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        libmimalloc_sys::mi_option_set(libmimalloc_sys::mi_option_large_os_pages, 1);
    }
    std::process::exit(concord::cli::main());
}
