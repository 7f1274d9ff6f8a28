//! Tenant jq expressions (endpoint filters and transforms, poller filters) as Herald checks
//! them: `scripts::bounds::check` in the server, a flat scan of length and nesting, then
//! `scripts::engine::Program::compile` in a sandbox worker, on the worker's serving thread
//! (64 MiB of stack, `scripts::worker`).
//!
//! Input: the expression. Invalid UTF-8 becomes U+FFFD (an expression always arrives as a
//! JSON string), so a mutation that breaks one character still tests the rest.
//!
//! Properties:
//! - `bounds::check` never panics;
//! - whatever it accepts, `Program::compile` never panics and never overflows the stack
//!   the worker compiles on. The sandbox would survive an overflow, but the bounds are
//!   meant to keep every expression a tenant can set well inside it.
//!
//! Compile runs on a thread spawned with that stack. An overflow there is a SIGSEGV on
//! the thread's guard page, and without AddressSanitizer no handler has a stack to run on:
//! libFuzzer's would fault again, and the process would die without saving the input. So
//! libFuzzer's SIGSEGV handler is told to run on an alternate stack, which each compile
//! thread sets up: an overflow is then reported ("deadly signal") and saved as a `crash-…`
//! artifact like a panic.
//!
//! Found (fixed): the bounds used to limit length and nesting only, and a long flat chain
//! recursed just as deep: about 4,190 prefix `-` overflowed jaq's parser and about 4,400
//! binary operators its compiler on the then 8 MiB stack. The bounds now count operators
//! too (at most 2,048), and the worker serves on a 64 MiB stack. Inputs:
//! fuzz/regressions/expression_check/ (replayed by scripts/fuzz-ci.sh).
#![no_main]

use std::ptr;
use std::sync::Once;
use std::thread;

use herald::scripts::bounds;
use herald::scripts::engine::Program;
use libfuzzer_sys::fuzz_target;

/// The sandbox worker's stack (`scripts::worker::STACK_BYTES`).
const WORKER_STACK: usize = herald::scripts::worker::STACK_BYTES;
/// Room for libFuzzer's report and artifact after an overflow.
const SIGNAL_STACK: usize = 256 * 1024;

fuzz_target!(|data: &[u8]| {
    let code = String::from_utf8_lossy(data).into_owned();
    if bounds::check(&code).is_err() {
        return;
    }
    handle_segv_on_alternate_stack();
    let worker = thread::Builder::new().stack_size(WORKER_STACK).spawn(move || {
        with_signal_stack(|| {
            let _ = Program::compile(&code);
        })
    });
    // A panic aborts the process in libfuzzer-sys's panic hook before `join` returns.
    worker.expect("a compile thread starts").join().expect("compile does not panic");
});

/// Adds `SA_ONSTACK` to whatever handles SIGSEGV (libFuzzer's handler: it is installed
/// before the first input runs).
fn handle_segv_on_alternate_stack() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: reads this process's SIGSEGV action and installs it again, the handler
        // unchanged, with one more flag; no other thread changes signal actions.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGSEGV, ptr::null(), &mut action), 0, "read the SIGSEGV action");
            action.sa_flags |= libc::SA_ONSTACK;
            assert_eq!(libc::sigaction(libc::SIGSEGV, &action, ptr::null_mut()), 0, "set the SIGSEGV action");
        }
    });
}

/// Runs `f` with an alternate signal stack for this thread, removed again before its
/// memory is freed.
fn with_signal_stack(f: impl FnOnce()) {
    let mut memory = vec![0u8; SIGNAL_STACK];
    let on = libc::stack_t { ss_sp: memory.as_mut_ptr().cast(), ss_flags: 0, ss_size: memory.len() };
    // SAFETY: `memory` outlives its use as this thread's signal stack (it is removed below).
    assert_eq!(unsafe { libc::sigaltstack(&on, ptr::null_mut()) }, 0, "set a signal stack");
    f();
    let off = libc::stack_t { ss_sp: ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
    // SAFETY: removes the signal stack set above; nothing is running on it here.
    assert_eq!(unsafe { libc::sigaltstack(&off, ptr::null_mut()) }, 0, "remove the signal stack");
}
