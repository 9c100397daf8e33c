//! Where module files are mapped. Module events carry no base address (and CoreCLR's
//! `ModuleRangeLoad` sends nothing), so image ranges come from the target's `/proc/PID/maps`:
//! [`read_proc_maps`] reads and parses it, [`parse_proc_maps`] parses text read elsewhere.
//! [`read_proc_maps`] also reads the precompiled methods of each managed image, and the
//! symbol table of a NativeAOT executable ([`ImageMethods`]), once per file for all processes.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::{Arc, Mutex, OnceLock};

use collector::local::LocalProcess;

use crate::r2r::{ImageMethods, R2rError};

/// Largest image file read for method names (`System.Private.CoreLib.dll` is ~13 MB).
const MAX_IMAGE_BYTES: u64 = 256 << 20;
/// Distinct image files whose methods are kept for all processes of this agent.
const MAX_CACHED_IMAGES: usize = 1024;

/// One mapped file: `[start, end)`, as the target process sees its path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageRange {
    /// Lowest address of the image.
    pub start: u64,
    /// One past the highest address.
    pub end: u64,
    /// The file's path in the target's mount namespace (the same path the runtime reports in
    /// `ModuleILPath`), without a ` (deleted)` suffix.
    pub path: String,
    /// The mapped file's device and inode as `/proc/PID/maps` shows them.
    pub file: Option<(u64, u64)>,
    /// The image's precompiled methods, for frames in code no event named.
    pub methods: Option<Arc<ImageMethods>>,
}

/// The executable file images of a runtime's process, from its `/proc/PID/maps` (see
/// [`parse_proc_maps`]), with the precompiled methods of each ReadyToRun image; read only while
/// the pid is that runtime ([`LocalProcess::read`]).
pub fn read_proc_maps(process: &LocalProcess) -> std::io::Result<Vec<ImageRange>> {
    Ok(reread_proc_maps(process, &[])?.unwrap_or_default())
}

/// [`read_proc_maps`] again, given what an earlier reading of the same process found (`known`):
/// `None` when the process maps the same images, having opened none of them; else the images,
/// the methods of those already known taken from `known`. An agent reads a process's maps for
/// every sampler window, and listing `map_files` and opening every managed image each time was
/// a tenth of a node agent's CPU.
pub fn reread_proc_maps(
    process: &LocalProcess,
    known: &[ImageRange],
) -> std::io::Result<Option<Vec<ImageRange>>> {
    let text = process.read("maps")?;
    let mut images = parse_proc_maps(&String::from_utf8_lossy(&text));
    let same_mapping = |a: &ImageRange, b: &ImageRange| {
        (a.start, a.end, a.file, &a.path) == (b.start, b.end, b.file, &b.path)
    };
    if images.len() == known.len() && images.iter().zip(known).all(|(a, b)| same_mapping(a, b)) {
        return Ok(None);
    }
    let pid = process.pid;
    let mut mapped = None;
    for image in images.iter_mut().filter(|i| names_its_code(&i.path)) {
        image.methods = match known.iter().find(|k| same_mapping(k, image)) {
            Some(earlier) => earlier.methods.clone(),
            None => image_methods(pid, image, mapped.get_or_insert_with(|| mapped_files(pid))),
        };
    }
    // The images were opened through the pid: it must still be the runtime's.
    process.verify()?;
    Ok(Some(images))
}

/// .NET modules are `.dll` (or `.exe`) files; the runtime's own code lives in `.so` files.
pub(crate) fn is_managed_image(path: &str) -> bool {
    let lower = file_name(path).to_ascii_lowercase();
    lower.ends_with(".dll") || lower.ends_with(".exe")
}

/// Whether an image may name its own code: a managed image (ReadyToRun tables), or an
/// executable, which may be a NativeAOT program (its symbol table); shared libraries are not read.
fn names_its_code(path: &str) -> bool {
    is_managed_image(path) || !file_name(path).contains(".so")
}

/// `/proc/PID/map_files` entries by the start address of their mapping.
fn mapped_files(pid: u32) -> HashMap<u64, String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/map_files")) else {
        return HashMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let start = u64::from_str_radix(name.split_once('-')?.0, 16).ok()?;
            Some((start, name))
        })
        .collect()
}

/// The methods of one image, from the cache or read now; `None` when the image has none to
/// give or cannot be read (its frames then stay `module!+0xOFFSET`).
fn image_methods(
    pid: u32,
    image: &ImageRange,
    mapped: &HashMap<u64, String>,
) -> Option<Arc<ImageMethods>> {
    let (file, verified) = open_image(pid, image, mapped)?;
    let stat = file.metadata().ok()?;
    if !stat.file_type().is_file() {
        return None;
    }
    // `map_files` is the very file the process mapped (the kernel resolves it); a path can be
    // anything the target put there, so it must be the mapped device and inode.
    if !verified && image.file != Some((stat.dev(), stat.ino())) {
        return None;
    }
    let key = (
        stat.dev(),
        stat.ino(),
        stat.size(),
        stat.mtime(),
        stat.mtime_nsec(),
    );
    let cache = IMAGE_CACHE.get_or_init(Default::default);
    if let Some(known) = cache.lock().ok()?.get(&key) {
        return known.clone();
    }
    let methods = read_image_methods(file, stat.size()).ok().map(Arc::new);
    let mut cache = cache.lock().ok()?;
    if cache.len() >= MAX_CACHED_IMAGES {
        cache.clear();
    }
    cache.insert(key, methods.clone());
    methods
}

type FileKey = (u64, u64, u64, i64, i64);

/// Image methods by file identity and version, shared by every process that maps the file.
static IMAGE_CACHE: OnceLock<Mutex<HashMap<FileKey, Option<Arc<ImageMethods>>>>> = OnceLock::new();

/// Opens the image through `/proc/PID/map_files` (needs privileges; verified by the kernel) or
/// else through `/proc/PID/root` without following a final link (verified by the caller).
fn open_image(
    pid: u32,
    image: &ImageRange,
    mapped: &HashMap<u64, String>,
) -> Option<(std::fs::File, bool)> {
    let flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if let Some(name) = mapped.get(&image.start) {
        if let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(format!("/proc/{pid}/map_files/{name}"))
        {
            return Some((file, true));
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NOFOLLOW)
        .open(format!("/proc/{pid}/root{}", image.path))
        .ok()?;
    Some((file, false))
}

fn read_image_methods(file: std::fs::File, size: u64) -> Result<ImageMethods, R2rError> {
    if size > MAX_IMAGE_BYTES {
        return Err(R2rError::TooLarge {
            size,
            limit: MAX_IMAGE_BYTES,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_IMAGE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| R2rError::Io(e.to_string()))?;
    if bytes.starts_with(b"\x7fELF") {
        return crate::native_aot::parse(&bytes);
    }
    ImageMethods::parse(&bytes)
}

/// Parses the text of `/proc/PID/maps` into executable file images.
///
/// The segments of one file are joined into one image while only anonymous mappings lie between
/// them (the runtime's PE loader reserves the image's whole span and maps sections into it); a
/// mapping of another file ends the image. Images without an executable segment, pseudo-files
/// (`[heap]`), and the JIT's double-mapped code heap (`/memfd:doublemapper`) are left out. Lines
/// that do not parse are skipped.
pub fn parse_proc_maps(text: &str) -> Vec<ImageRange> {
    let mut images = Vec::new();
    let mut current: Option<(ImageRange, bool)> = None;
    for line in text.lines() {
        let Some(mapping) = parse_line(line) else {
            continue;
        };
        match mapping.path {
            None => continue,
            Some(path) => {
                if let Some((image, executable)) = &mut current {
                    if image.path == path && mapping.start >= image.start {
                        image.end = image.end.max(mapping.end);
                        *executable |= mapping.executable;
                        continue;
                    }
                }
                if let Some((image, true)) = current.take() {
                    images.push(image);
                }
                current = Some((
                    ImageRange {
                        start: mapping.start,
                        end: mapping.end,
                        path: path.to_string(),
                        file: mapping.file,
                        methods: None,
                    },
                    mapping.executable,
                ));
            }
        }
    }
    if let Some((image, true)) = current {
        images.push(image);
    }
    images
}

struct Mapping<'a> {
    start: u64,
    end: u64,
    executable: bool,
    /// A real file path; `None` for anonymous and pseudo mappings.
    path: Option<&'a str>,
    /// Device and inode.
    file: Option<(u64, u64)>,
}

fn parse_line(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let device = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().map(str::trim_start).unwrap_or("");
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if start >= end {
        return None;
    }
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let is_file = path.starts_with('/') && !path.starts_with("/memfd:");
    Some(Mapping {
        start,
        end,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        path: is_file.then_some(path),
        file: parse_device(device).zip(inode.parse().ok()),
    })
}

/// `major:minor` in hex, as `/proc/PID/maps` prints it, as the kernel's `dev_t` (`makedev`).
fn parse_device(text: &str) -> Option<u64> {
    let (major, minor) = text.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    Some(libc::makedev(major, minor))
}

/// The file name shown for a module: the last component of its path (`/` or `\` separated).
pub(crate) fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d4c0a00000-55d4c0a02000 r--p 00000000 08:01 1234   /usr/share/dotnet/dotnet
55d4c0a02000-55d4c0a10000 r-xp 00002000 08:01 1234   /usr/share/dotnet/dotnet
7f1000000000-7f1000010000 r--s 00000000 08:01 99     /usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Linq.dll
7f1000010000-7f1000011000 ---p 00000000 00:00 0
7f1000011000-7f1000090000 r-xs 00011000 08:01 99     /usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Linq.dll
7f1000090000-7f10000a0000 rw-p 00090000 08:01 99     /usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.0/System.Linq.dll
7f2000000000-7f2000100000 r--p 00000000 08:01 77     /usr/share/icu/icudt72l.dat
7f3000000000-7f3000100000 r-xs 00000000 00:01 5      /memfd:doublemapper (deleted)
7f4000000000-7f4000001000 r-xp 00000000 08:01 42     /app/MyApp.dll (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]
";

    #[test]
    fn joins_segments_and_skips_noise() {
        let images = parse_proc_maps(MAPS);
        let summary: Vec<(u64, u64, &str)> = images
            .iter()
            .map(|i| (i.start, i.end, file_name(&i.path)))
            .collect();
        assert_eq!(
            summary,
            vec![
                (0x55d4c0a00000, 0x55d4c0a10000, "dotnet"),
                (0x7f1000000000, 0x7f10000a0000, "System.Linq.dll"),
                (0x7f4000000000, 0x7f4000001000, "MyApp.dll"),
            ]
        );
        assert_eq!(images[2].path, "/app/MyApp.dll");
    }

    #[test]
    fn another_file_in_between_splits_the_image() {
        let maps = "\
1000-2000 r-xp 0 0:0 1 /a.dll
2000-3000 r-xp 0 0:0 2 /b.dll
3000-4000 r-xp 0 0:0 1 /a.dll
";
        let images = parse_proc_maps(maps);
        assert_eq!(images.len(), 3);
        assert_eq!((images[2].start, images[2].end), (0x3000, 0x4000));
    }

    #[test]
    fn file_names_from_either_separator() {
        assert_eq!(file_name("/usr/lib/System.Linq.dll"), "System.Linq.dll");
        assert_eq!(file_name("C:\\app\\MyApp.dll"), "MyApp.dll");
        assert_eq!(
            file_name("RefEmit_InMemoryManifestModule"),
            "RefEmit_InMemoryManifestModule"
        );
        assert_eq!(file_name(""), "");
    }

    #[test]
    fn reads_this_process_maps() {
        let pid = u64::from(std::process::id());
        let command_line = std::env::args().collect::<Vec<_>>().join(" ");
        let me = LocalProcess::find(pid, pid, &command_line).unwrap();
        let images = read_proc_maps(&me).unwrap();
        let this = std::env::current_exe().unwrap();
        assert!(images.iter().any(|i| std::path::Path::new(&i.path) == this));

        // Read again with what was found: the same images, so nothing new.
        assert_eq!(reread_proc_maps(&me, &images).unwrap(), None);
        // With one image unknown, all of them again.
        let fewer = &images[1..];
        assert_eq!(reread_proc_maps(&me, fewer).unwrap(), Some(images));
    }

    #[test]
    fn hostile_lines_never_panic() {
        let text = "-\n-1 x\nzz-yy r-xp 0 0 0 /x\n2000-1000 r-xp 0 0 0 /x\n1-2\n1-2 r\n\u{FFFF}";
        assert!(parse_proc_maps(text).is_empty());
    }
}
