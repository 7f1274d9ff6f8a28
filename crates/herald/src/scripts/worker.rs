//! The sandbox worker: a child process (`herald sandbox-worker`) that runs jq expressions
//! for its parent, one at a time, over its standard input and output. It has an empty
//! environment, a bounded address space and nothing else to do: an expression that loops
//! is killed with it by the parent's deadline, one that eats memory or stack ends it, and
//! the parent starts another.
//!
//! Once ready it writes [`READY`]. Then requests and answers, all lengths little-endian
//! u32. A request is an operation byte, [`EVALUATE`] (the expression's length and text,
//! then the input's length and JSON text) or [`COMPILE`] (the expression's length and text
//! only: is it valid jq?). An answer is a status byte ([`OK`], [`NOTHING`], [`FAILED`]),
//! then the length and text of the first output or of the error (empty for a compile that
//! succeeded).
//!
//! Tenants' expressions are compiled here and nowhere else: jq's parser recurses once per
//! nesting level, and an expression built to exhaust the stack ends this process, never
//! Herald's.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};

use super::engine::{Output, Program};

/// Written once at start, when the limits are set: the parent's deadlines count from there.
pub const READY: u8 = b'R';
pub const OK: u8 = 0;
pub const NOTHING: u8 = 1;
pub const FAILED: u8 = 2;
/// Operations.
pub const EVALUATE: u8 = b'E';
pub const COMPILE: u8 = b'C';

/// Compiled expressions kept at most (the cache is emptied when it fills).
const CACHE: usize = 512;
/// Longest expression or input accepted in one frame.
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

/// The stack requests are served on: jq's parser and compiler recurse once per nesting
/// level and operator, which `bounds` limits; this leaves room for the deepest expression
/// the bounds let through many times over (a debug build's frames included).
pub const STACK_BYTES: usize = 64 * 1024 * 1024;

/// Serves requests on stdin/stdout until the parent closes stdin. `memory_bytes` caps the
/// address space first; an output longer than `max_output` bytes is answered as a failure.
/// Requests are served on a thread with a [`STACK_BYTES`] stack.
pub fn serve(memory_bytes: u64, max_output: usize) -> io::Result<()> {
    let served =
        std::thread::Builder::new().stack_size(STACK_BYTES).spawn(move || serve_on(memory_bytes, max_output))?;
    served.join().unwrap_or_else(|_| Err(io::Error::other("the worker's thread panicked")))
}

fn serve_on(memory_bytes: u64, max_output: usize) -> io::Result<()> {
    limit_memory(memory_bytes)?;
    lower_priority();
    let mut input = BufReader::new(io::stdin().lock());
    let mut output = BufWriter::new(io::stdout().lock());
    output.write_all(&[READY])?;
    output.flush()?;
    let mut programs: HashMap<String, Result<Program, String>> = HashMap::new();
    loop {
        let mut op = [0u8];
        match input.read_exact(&mut op) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let code = read_frame(&mut input)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let code = String::from_utf8(code).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let data = match op[0] {
            EVALUATE => Some(read_frame(&mut input)?.ok_or(io::ErrorKind::UnexpectedEof)?),
            COMPILE => None,
            _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "unknown operation")),
        };
        if programs.len() >= CACHE && !programs.contains_key(&code) {
            programs.clear();
        }
        let program = programs.entry(code).or_insert_with_key(|code| Program::compile(code).map_err(|e| e.to_string()));
        let program = program.as_ref().map_err(Clone::clone);
        let (status, text) = match (program, data) {
            (Err(e), _) => (FAILED, e),
            (Ok(_), None) => (OK, String::new()),
            (Ok(program), Some(data)) => match program.run(&data) {
                Ok(Output::Value(value)) if value.len() > max_output => {
                    (FAILED, format!("the output is longer than {max_output} bytes"))
                }
                Ok(Output::Value(value)) => (OK, value),
                Ok(Output::Nothing) => (NOTHING, String::new()),
                Err(e) => (FAILED, e),
            },
        };
        output.write_all(&[status])?;
        write_frame(&mut output, text.as_bytes())?;
        output.flush()?;
    }
}

/// Reads one length-prefixed frame; `None` at a clean end of input.
pub fn read_frame(from: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match from.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
    }
    let mut buf = vec![0; len];
    from.read_exact(&mut buf)?;
    Ok(Some(buf))
}

pub fn write_frame(to: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    to.write_all(&(bytes.len() as u32).to_le_bytes())?;
    to.write_all(bytes)
}

/// How much lower than Herald's own a worker's CPU priority is (nice levels).
const NICE: libc::c_int = 10;

/// Lowers this process's CPU priority: an expression that spins until its deadline then
/// competes for the CPU with other workers, never ahead of Herald's own threads (the API,
/// the dispatcher, deliveries), so one tenant's runaway transform slows no one else's
/// messages. A worker that cannot lower it (not permitted) runs as it is.
fn lower_priority() {
    // SAFETY: setpriority changes only this process's scheduling priority.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, NICE);
    }
}

/// Caps the address space at what the process has mapped now plus `bytes`: the budget is
/// what expressions may use, whatever the binary and its allocator reserved at start (a
/// debug build maps a gigabyte before it reads a byte).
fn limit_memory(bytes: u64) -> io::Result<()> {
    let cap = mapped_now().unwrap_or(0).saturating_add(bytes);
    let limit = libc::rlimit { rlim_cur: cap as libc::rlim_t, rlim_max: cap as libc::rlim_t };
    // SAFETY: setrlimit reads the struct we pass and changes only this process's limits.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's address space now, in bytes (`/proc/self/statm`: its size in pages).
fn mapped_now() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}
