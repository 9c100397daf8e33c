//! A small, realistic .NET profile and the golden-file switch the tests share.

use profile::{Function, LabelValue, Profile, ProfileBuilder, ValueType};

#[path = "../../../tests/support/golden.rs"]
mod golden;

pub use golden::check_golden;

/// 10 ms sampling period, in nanoseconds.
pub const PERIOD: i64 = 10_000_000;

/// Two threads of the CpuHot test target: `Main` spinning through LINQ, a thread-pool worker,
/// and one native sample with an unnamed frame (no module, no cpu time) and one with no stack.
pub fn cpu_hot() -> Profile {
    let mut b = ProfileBuilder::new(
        vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        ValueType::new("cpu", "nanoseconds"),
        PERIOD,
    );
    b.set_default_sample_type(1);
    // 2025-11-30T01:08:00Z, 10 s.
    b.set_time_range(1_764_464_880_000_000_000, 10_000_000_000);
    let mut f = |name: &str, module: &str| {
        b.function(Function {
            name: name.into(),
            module: module.into(),
        })
    };
    let main = f("CpuHot.Program.Main(System.String[])", "CpuHot.dll");
    let alpha = f("CpuHot.Program.SpinAlpha()", "CpuHot.dll");
    let beta = f("CpuHot.Program.SpinBeta()", "CpuHot.dll");
    let sum = f(
        "System.Linq.Enumerable.Sum(System.Collections.Generic.IEnumerable<System.Int32>)",
        "System.Linq.dll",
    );
    let start = f(
        "System.Threading.Thread.StartCallback()",
        "System.Private.CoreLib.dll",
    );
    let native = f("[unknown]", "");

    let main_thread = || {
        vec![
            ("thread_id".to_string(), LabelValue::Num(101)),
            ("thread_name".to_string(), LabelValue::Str("Main".into())),
        ]
    };
    let worker = || {
        vec![
            ("thread_id".to_string(), LabelValue::Num(202)),
            (
                "thread_name".to_string(),
                LabelValue::Str(".NET TP Worker".into()),
            ),
        ]
    };
    let cpu = |n: i64| [n, n * PERIOD];
    b.add(vec![alpha, main], main_thread(), &cpu(5));
    b.add(vec![sum, alpha, main], main_thread(), &cpu(3));
    b.add(vec![beta, main], main_thread(), &cpu(2));
    b.add(vec![beta, start], worker(), &cpu(4));
    b.add(vec![sum, beta, start], worker(), &cpu(1));
    b.add(vec![native, start], worker(), &[1, 0]);
    b.add(vec![], worker(), &cpu(1));
    b.build()
}
