//! A method's names, shared by every code map that knows the method.
//!
//! Each process's rundown lists thousands of methods, most of them the runtime's own framework
//! code (`System.Private.CoreLib` and the rest of the shared framework), which is the same in
//! every process of a runtime version. A node agent profiling a hundred processes would keep a
//! hundred copies of those names; instead every code map interns them in one table of the whole
//! program, keyed by their content hash. The table holds them weakly: names live as long as one
//! code map uses them, so processes that come and go leave nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::map::FunctionKey;
use crate::names::display_name;

/// A method's namespace, name and signature as the runtime reports them, and its C#-like display
/// name, built on first use (most methods of a process never appear in a sample).
#[derive(Debug)]
pub struct MethodNames {
    namespace: Box<str>,
    name: Box<str>,
    signature: Box<str>,
    display: OnceLock<Arc<str>>,
}

impl MethodNames {
    /// Names that are not shared: an image's or an unnamed method's, whose display name is
    /// given.
    pub(crate) fn labelled(display: String) -> Arc<MethodNames> {
        Arc::new(MethodNames {
            namespace: "".into(),
            name: "".into(),
            signature: "".into(),
            display: OnceLock::from(Arc::from(display)),
        })
    }

    /// The runtime's `MethodNamespace`: the declaring type.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The runtime's `MethodName`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runtime's `MethodSignature`.
    pub fn signature(&self) -> &str {
        &self.signature
    }

    /// The C#-like name, see the crate documentation.
    pub fn display(&self) -> &str {
        self.shared_display()
    }

    /// The display name itself, for what keeps it beside the code map (exception frames).
    pub fn shared_display(&self) -> &Arc<str> {
        self.display
            .get_or_init(|| display_name(&self.namespace, &self.name, &self.signature).into())
    }

    fn is(&self, namespace: &str, name: &str, signature: &str) -> bool {
        &*self.namespace == namespace && &*self.name == name && &*self.signature == signature
    }
}

/// Every code map's method names, by content hash.
#[derive(Default)]
struct Table {
    by_key: HashMap<FunctionKey, Weak<MethodNames>>,
    /// The table is swept of names no code map uses when it reaches this size.
    sweep_at: usize,
}

/// Smallest table size that triggers a sweep.
const MIN_SWEEP: usize = 4096;

static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();

/// The shared names of the method whose strings hash to `key`: the names another code map
/// already holds, else new ones that the next code map will share.
pub(crate) fn intern(
    key: FunctionKey,
    namespace: &str,
    name: &str,
    signature: &str,
) -> Arc<MethodNames> {
    let table = TABLE.get_or_init(Mutex::default);
    // The table holds no invariant a panic could break halfway: a poisoned lock is still good.
    let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(names) = table.by_key.get(&key).and_then(Weak::upgrade) {
        if names.is(namespace, name, signature) {
            return names;
        }
        // A 64-bit collision: the second method's names are correct, only not shared.
        return new_names(namespace, name, signature);
    }
    let names = new_names(namespace, name, signature);
    table.by_key.insert(key, Arc::downgrade(&names));
    if table.by_key.len() >= table.sweep_at {
        table.by_key.retain(|_, names| names.strong_count() > 0);
        table.sweep_at = (table.by_key.len() * 2).max(MIN_SWEEP);
    }
    names
}

fn new_names(namespace: &str, name: &str, signature: &str) -> Arc<MethodNames> {
    Arc::new(MethodNames {
        namespace: namespace.into(),
        name: name.into(),
        signature: signature.into(),
        display: OnceLock::new(),
    })
}
