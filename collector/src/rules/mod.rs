//! Collection rules: dotnet-monitor's `CollectionRules` (triggers, actions, limits) on the
//! processes the agent attaches to, plus clrscope's pre-trigger capture.
//!
//! - [`options`]: the settings sections, read and checked as dotnet-monitor reads them
//!   ([`options::compile`]).
//! - [`trigger`]: trigger conditions as state machines over events and counter values.
//! - [`schedule`]: the Schedule trigger's times (every interval, or a cron expression in UTC).
//! - [`state`]: a rule's state and limits on one process, and the `/collectionrules` JSON.
//! - [`engine`]: running a rule on a process (trigger sessions, throttling, the action list).
//! - [`ring`], [`capture`]: the pre-trigger ring buffer of raw nettrace blocks, and the task
//!   that cuts traces starting `PreTriggerSeconds` before their trigger from it.
//!
//! Settings (see README.md for an example):
//!
//! ```text
//! CollectionRules:<name>:Filters[]          {Key, Value, MatchType} or {ProcessName: …}
//! CollectionRules:<name>:Trigger            {Type, Settings}
//! CollectionRules:<name>:Actions[]          {Name, Type, Settings, WaitForCompletion}
//! CollectionRules:<name>:Limits             {ActionCount, ActionCountSlidingWindowDuration, RuleDuration}
//! CollectionRuleDefaults                    {Actions:{Egress}, Triggers:{…}, Limits:{…}}
//! ```

pub mod capture;
mod config;
pub mod engine;
pub mod options;
pub mod ring;
pub mod schedule;
pub mod state;
pub mod trigger;

pub use config::{format_timespan, ConfigError};
