//! Every managed thread's named stack at one moment ([`capture`]: one sampler tick from
//! `collector::artifacts::collect_stack_tick`, named by its rundown and the process's mapped
//! files), and dotnet-monitor's `/stacks` formats of them: plain text, JSON (`CallStackResult`)
//! and speedscope. The API's `/stacks`, the CollectStacks rule action and `clrscope stacks` all
//! capture through [`capture`].
//!
//! ```no_run
//! # async fn demo(client: collector::client::DiagnosticsClient, pid: u32) -> Result<(), collector::artifacts::ArtifactError> {
//! use collector::artifacts::StackFormat;
//! let local = collector::local::LocalProcess::of_runtime(&client, u64::from(pid)).await;
//! let stacks = symbolizer::stacks::capture(&client, local.as_ref()).await?;
//! let text = stacks.render(StackFormat::PlainText);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;

use collector::artifacts::{collect_stack_tick, ArtifactError, StackFormat};
use collector::client::DiagnosticsClient;
use collector::local::LocalProcess;
use collector::samples::StackKey;
use collector::session::EventObserver;
use nettrace::Event;
use serde::Serialize;

use crate::map::CodeMap;

/// dotnet-monitor's marker for a run of native frames.
pub const NATIVE_FRAME: &str = "[NativeFrame]";
/// dotnet-monitor's module GUID when none is known.
const NO_MODULE_VERSION_ID: &str = "00000000-0000-0000-0000-000000000000";

/// Every managed thread's stack in the runtime behind `client`, at one moment, named.
/// `local` is the runtime's process on this machine, when it is proven: its mapped files then
/// name frames in no known method, and its threads' names are read.
pub async fn capture(
    client: &DiagnosticsClient,
    local: Option<&LocalProcess>,
) -> Result<CallStacks, ArtifactError> {
    let mut map = CodeMap::default();
    if let Some(images) = local.and_then(|local| crate::read_proc_maps(local).ok()) {
        map.set_images(images);
    }
    let mut rundown = RundownMap { map };
    let tick = collect_stack_tick(client, &mut rundown).await?;
    let threads = local.map(LocalProcess::thread_names).unwrap_or_default();
    Ok(CallStacks::build(&rundown.map, &tick, &threads))
}

/// A code map fed with a session's method and module events (the rundown of a stack tick);
/// events it cannot use (malformed payloads) are passed over.
struct RundownMap {
    map: CodeMap,
}

impl EventObserver for RundownMap {
    fn on_event(&mut self, event: &Event<'_>) {
        let timestamp = event.header.timestamp as u64;
        if let Ok(Some(known)) = event.known() {
            let _ = crate::nettrace::apply(&mut self.map, &known, timestamp);
        }
    }
}

/// One frame, innermost first in its stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackFrame {
    /// In managed code of a known method (else native code, an image or unknown).
    pub managed: bool,
    /// The C#-like name for managed frames, `module!+0xOFFSET` or `[unknown]` for others.
    pub display: String,
    /// The declaring type, fully qualified (managed frames).
    pub type_name: String,
    pub method_name: String,
    pub method_token: u32,
    /// The module's file name, empty when unknown.
    pub module: String,
}

/// One thread's stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStack {
    pub thread_id: u64,
    pub thread_name: Option<String>,
    /// Running managed code when sampled (else in native code, blocked or waiting).
    pub managed: bool,
    pub frames: Vec<StackFrame>,
}

/// Every thread's stack at one moment, by thread id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallStacks {
    pub stacks: Vec<ThreadStack>,
}

impl CallStacks {
    /// Names the tick's stacks with `map`; `thread_names` by thread id.
    fn build(map: &CodeMap, tick: &[StackKey], thread_names: &HashMap<u64, String>) -> CallStacks {
        let mut stacks: Vec<ThreadStack> = tick
            .iter()
            .map(|sample| ThreadStack {
                thread_id: sample.thread_id,
                thread_name: thread_names.get(&sample.thread_id).cloned(),
                managed: sample.managed,
                frames: map
                    .symbolize_stack(&sample.ips)
                    .into_iter()
                    .map(|frame| {
                        let function = map.function(frame.function);
                        let name = map.method_name(frame);
                        StackFrame {
                            managed: name.is_some(),
                            display: match name {
                                Some(name) => name.to_string(),
                                None => map.frame_label(frame),
                            },
                            type_name: function.namespace().to_string(),
                            method_name: function.name().to_string(),
                            method_token: function.token,
                            module: function.module.to_string(),
                        }
                    })
                    .collect(),
            })
            .collect();
        stacks.sort_by_key(|s| s.thread_id);
        CallStacks { stacks }
    }

    /// The stacks in `format`, as dotnet-monitor writes them.
    pub fn render(&self, format: StackFormat) -> String {
        match format {
            StackFormat::PlainText => self.to_text(),
            StackFormat::Json => self.to_json(),
            StackFormat::Speedscope => self.to_speedscope(),
        }
    }

    /// `Thread: (0xID) name` then one `  Module!Type.Method` line per frame (innermost first), a
    /// run of native frames as one `[NativeFrame]`, a blank line after each thread.
    fn to_text(&self) -> String {
        let mut text = String::new();
        for stack in &self.stacks {
            text.push_str(&thread_header(stack));
            text.push('\n');
            for frame in monitor_frames(stack) {
                let _ = writeln!(text, "  {}", frame_name(frame));
            }
            text.push('\n');
        }
        text
    }

    /// dotnet-monitor's `CallStackResult`.
    fn to_json(&self) -> String {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Frame<'a> {
            method_name: &'a str,
            method_token: u32,
            type_name: &'a str,
            module_name: &'a str,
            module_version_id: &'static str,
            hidden: bool,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Stack<'a> {
            thread_id: u64,
            thread_name: &'a str,
            frames: Vec<Frame<'a>>,
        }
        #[derive(Serialize)]
        struct Result<'a> {
            stacks: Vec<Stack<'a>>,
        }
        let result = Result {
            stacks: self
                .stacks
                .iter()
                .map(|stack| Stack {
                    thread_id: stack.thread_id,
                    thread_name: stack.thread_name.as_deref().unwrap_or(""),
                    frames: monitor_frames(stack)
                        .map(|frame| match frame {
                            Some(f) => Frame {
                                method_name: &f.method_name,
                                method_token: f.method_token,
                                type_name: &f.type_name,
                                module_name: &f.module,
                                module_version_id: NO_MODULE_VERSION_ID,
                                hidden: false,
                            },
                            None => Frame {
                                method_name: NATIVE_FRAME,
                                method_token: 0,
                                type_name: NATIVE_FRAME,
                                module_name: NATIVE_FRAME,
                                module_version_id: NO_MODULE_VERSION_ID,
                                hidden: false,
                            },
                        })
                        .collect(),
                })
                .collect(),
        };
        serde_json::to_string(&result).unwrap_or_default()
    }

    /// A speedscope file with one evented profile per thread (start 0, end 1, unit none) and
    /// frames shared by name, as dotnet-monitor writes it; each stack opens outermost first so
    /// speedscope draws callers above callees.
    fn to_speedscope(&self) -> String {
        let mut frames: Vec<String> = vec![NATIVE_FRAME.to_string()];
        let mut index: HashMap<String, usize> = HashMap::new();
        let profiles: Vec<serde_json::Value> = self
            .stacks
            .iter()
            .map(|stack| {
                let opened: Vec<usize> = monitor_frames(stack)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .map(|frame| match frame {
                        None => 0,
                        Some(f) => {
                            let name = frame_name(Some(f));
                            *index.entry(name.clone()).or_insert_with(|| {
                                frames.push(name);
                                frames.len() - 1
                            })
                        }
                    })
                    .collect();
                let events: Vec<serde_json::Value> = opened
                    .iter()
                    .map(|&f| serde_json::json!({"type": "O", "frame": f, "at": 0.0}))
                    .chain(
                        opened
                            .iter()
                            .rev()
                            .map(|&f| serde_json::json!({"type": "C", "frame": f, "at": 1.0})),
                    )
                    .collect();
                serde_json::json!({
                    "type": "evented",
                    "name": thread_header(stack),
                    "unit": "none",
                    "startValue": 0.0,
                    "endValue": 1.0,
                    "events": events,
                })
            })
            .collect();
        let file = serde_json::json!({
            "exporter": format!("clrscope@{}", env!("CARGO_PKG_VERSION")),
            "name": "speedscope.json",
            "activeProfileIndex": 0,
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "profiles": profiles,
            "shared": {"frames": frames.iter().map(|name| serde_json::json!({"name": name})).collect::<Vec<_>>()},
        });
        file.to_string()
    }
}

/// `Thread: (0x1A2B) name`, dotnet-monitor's thread header.
fn thread_header(stack: &ThreadStack) -> String {
    match stack.thread_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("Thread: (0x{:X}) {name}", stack.thread_id),
        None => format!("Thread: (0x{:X})", stack.thread_id),
    }
}

/// The frames dotnet-monitor shows: managed frames, and `None` for each run of other frames.
fn monitor_frames(stack: &ThreadStack) -> impl Iterator<Item = Option<&StackFrame>> {
    let mut previous_native = false;
    stack.frames.iter().filter_map(move |frame| {
        if frame.managed {
            previous_native = false;
            Some(Some(frame))
        } else if previous_native {
            None
        } else {
            previous_native = true;
            Some(None)
        }
    })
}

/// `Module!Type.Method`, or `[NativeFrame]`.
fn frame_name(frame: Option<&StackFrame>) -> String {
    match frame {
        None => NATIVE_FRAME.to_string(),
        Some(f) if f.type_name.is_empty() => format!("{}!{}", f.module, f.method_name),
        Some(f) => format!("{}!{}.{}", f.module, f.type_name, f.method_name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(managed: bool, type_name: &str, method: &str) -> StackFrame {
        StackFrame {
            managed,
            display: format!("{type_name}.{method}"),
            type_name: type_name.into(),
            method_name: method.into(),
            method_token: if managed { 0x0600_0001 } else { 0 },
            module: if managed {
                "App.dll".into()
            } else {
                String::new()
            },
        }
    }

    fn sample() -> CallStacks {
        CallStacks {
            stacks: vec![ThreadStack {
                thread_id: 0x1a2b,
                thread_name: Some("Worker".into()),
                managed: true,
                frames: vec![
                    frame(false, "", "a"),
                    frame(false, "", "b"),
                    frame(true, "App.Program", "Spin"),
                    frame(true, "App.Program", "Main"),
                ],
            }],
        }
    }

    #[test]
    fn text_is_dotnet_monitors() {
        assert_eq!(
            sample().render(StackFormat::PlainText),
            "Thread: (0x1A2B) Worker\n  [NativeFrame]\n  App.dll!App.Program.Spin\n  \
             App.dll!App.Program.Main\n\n"
        );
    }

    #[test]
    fn json_is_a_call_stack_result() {
        let json: serde_json::Value =
            serde_json::from_str(&sample().render(StackFormat::Json)).unwrap();
        let stack = &json["stacks"][0];
        assert_eq!(stack["threadId"], 0x1a2b);
        assert_eq!(stack["threadName"], "Worker");
        let frames = stack["frames"].as_array().unwrap();
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0]["methodName"], NATIVE_FRAME);
        assert_eq!(frames[1]["methodName"], "Spin");
        assert_eq!(frames[1]["typeName"], "App.Program");
        assert_eq!(frames[1]["moduleName"], "App.dll");
        assert_eq!(frames[1]["methodToken"], 0x0600_0001);
        assert_eq!(frames[1]["hidden"], false);
    }

    #[test]
    fn speedscope_events_nest() {
        let json: serde_json::Value =
            serde_json::from_str(&sample().render(StackFormat::Speedscope)).unwrap();
        let events = json["profiles"][0]["events"].as_array().unwrap();
        let frames = json["shared"]["frames"].as_array().unwrap();
        let opened: Vec<&str> = events
            .iter()
            .filter(|e| e["type"] == "O")
            .map(|e| {
                frames[e["frame"].as_u64().unwrap() as usize]["name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            opened,
            [
                "App.dll!App.Program.Main",
                "App.dll!App.Program.Spin",
                NATIVE_FRAME
            ]
        );
        let closed: Vec<u64> = events
            .iter()
            .filter(|e| e["type"] == "C")
            .map(|e| e["frame"].as_u64().unwrap())
            .collect();
        let mut reopened: Vec<u64> = events
            .iter()
            .filter(|e| e["type"] == "O")
            .map(|e| e["frame"].as_u64().unwrap())
            .collect();
        reopened.reverse();
        assert_eq!(closed, reopened);
    }
}
