//! Method tables read from real ReadyToRun images of the test bed's runtime, and what a damaged
//! or hostile image does to the reader (nothing: an error, never a panic or a blow-up).

use crate::support;

use symbolizer::{ImageMethods, R2rError};

/// A file of the shared framework directory of the runtime under test.
fn framework_file(name: &str) -> Vec<u8> {
    std::fs::read(support::shared_framework_dir().join(name)).unwrap()
}

#[test]
fn names_the_socket_engines_wait() {
    let methods = ImageMethods::parse(&framework_file("System.Net.Sockets.dll")).unwrap();
    assert!(methods.len() > 500, "{methods:?}");
    // The epoll wait no event ever names: find it by name, then by every address inside it.
    let names: Vec<&str> = (0..0x100000u64)
        .step_by(16)
        .filter_map(|rva| methods.method_at(rva).map(|(_, name)| name))
        .collect();
    assert!(names.contains(&"Interop.Sys.WaitForSocketEvents(nint, SocketEvent*, int*)"));
    assert!(names.contains(&"System.Net.Sockets.SocketAsyncEngine.EventLoop()"));
}

#[test]
fn images_without_precompiled_code_say_so() {
    let mut il_only = framework_file("System.Net.Sockets.dll");
    assert!(matches!(
        ImageMethods::parse(b"not a PE file"),
        Err(R2rError::NotManaged(_))
    ));
    assert!(ImageMethods::parse(&[]).is_err());
    // The CLI header's ManagedNativeHeader directory (offset 64) cleared: an IL-only image.
    let pe = u32::from_le_bytes(il_only[0x3c..0x40].try_into().unwrap()) as usize;
    let cli_rva = u32::from_le_bytes(il_only[pe + 24 + 112 + 14 * 8..][..4].try_into().unwrap());
    let cli = rva_to_offset(&il_only, cli_rva);
    il_only[cli + 64..cli + 72].fill(0);
    assert_eq!(ImageMethods::parse(&il_only), Err(R2rError::NotReadyToRun));
}

#[test]
fn damaged_images_never_panic_or_amplify() {
    let image = framework_file("System.Net.Sockets.dll");
    // Truncated anywhere.
    for cut in (0..image.len()).step_by(image.len() / 97) {
        let _ = ImageMethods::parse(&image[..cut]);
    }
    // Bytes flipped in the headers and tables (a deterministic pseudo-random walk).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        let mut damaged = image.clone();
        for _ in 0..8 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % damaged.len() as u64) as usize;
            damaged[at] = (state >> 32) as u8;
        }
        if let Ok(methods) = ImageMethods::parse(&damaged) {
            assert!(methods.len() <= damaged.len() / 12);
        }
    }
}

fn rva_to_offset(image: &[u8], rva: u32) -> usize {
    let pe = u32::from_le_bytes(image[0x3c..0x40].try_into().unwrap()) as usize;
    let sections = u16::from_le_bytes(image[pe + 6..pe + 8].try_into().unwrap()) as usize;
    let optional = u16::from_le_bytes(image[pe + 20..pe + 22].try_into().unwrap()) as usize;
    let table = pe + 24 + optional;
    (0..sections)
        .map(|i| {
            let s = &image[table + i * 40..];
            let field = |at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap());
            (field(12), field(16), field(20))
        })
        .find(|&(va, size, _)| rva >= va && rva < va + size)
        .map(|(va, _, raw)| (raw + rva - va) as usize)
        .unwrap()
}
