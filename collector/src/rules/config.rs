//! Reading a configuration tree the way .NET's configuration binder reads it: keys match
//! case-insensitively, numbers and booleans may be written as strings (environment variables
//! always are), a list may be a JSON array or an object keyed `0`, `1`, … (what `__0__` in an
//! environment variable becomes), and `TimeSpan` values use .NET's `[d.]hh:mm:ss[.fffffff]`
//! ([`settings::parse_timespan`]).
//! Every error names the key path (`Rule:Trigger:Settings:RequestCount`) and what was expected.

use std::time::Duration;

use serde_json::Value;

/// A configuration value that does not fit its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ConfigError {
    /// The key path, `:`-separated as dotnet-monitor prints it.
    pub path: String,
    pub reason: String,
}

/// A node of the tree with its path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<'a> {
    pub value: &'a Value,
    path: &'a str,
}

/// An owned path plus the node; children borrow the parent's path through this.
pub(crate) struct Child<'a> {
    pub value: &'a Value,
    pub path: String,
}

impl<'a> Child<'a> {
    pub fn node(&self) -> Node<'_> {
        Node {
            value: self.value,
            path: &self.path,
        }
    }
}

impl<'a> Node<'a> {
    pub fn new(value: &'a Value, path: &'a str) -> Self {
        Node { value, path }
    }

    pub fn path(&self) -> &str {
        self.path
    }

    pub fn error(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            path: self.path.to_string(),
            reason: reason.into(),
        }
    }

    fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}:{key}", self.path)
        }
    }

    /// The value under `key` (matched case-insensitively); `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<Child<'a>> {
        let Value::Object(map) = self.value else {
            return None;
        };
        map.iter()
            .find(|(k, v)| k.eq_ignore_ascii_case(key) && !v.is_null())
            .map(|(k, value)| Child {
                value,
                path: self.child_path(k),
            })
    }

    /// Fails unless this is an object (or absent-as-empty).
    pub fn object(&self) -> Result<Vec<(String, Child<'a>)>, ConfigError> {
        match self.value {
            Value::Object(map) => Ok(map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, value)| {
                    (
                        k.clone(),
                        Child {
                            value,
                            path: self.child_path(k),
                        },
                    )
                })
                .collect()),
            _ => Err(self.error("expected an object of settings")),
        }
    }

    /// A list: a JSON array, or an object whose keys are 0, 1, … (in numeric order).
    pub fn list(&self) -> Result<Vec<Child<'a>>, ConfigError> {
        match self.value {
            Value::Array(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, value)| Child {
                    value,
                    path: self.child_path(&i.to_string()),
                })
                .collect()),
            Value::Object(map) => {
                let mut items = Vec::with_capacity(map.len());
                for (k, value) in map {
                    let index: usize = k.parse().map_err(|_| {
                        self.error(format!(
                            "expected a list (a JSON array, or keys 0, 1, …); found key {k:?}"
                        ))
                    })?;
                    items.push((
                        index,
                        Child {
                            value,
                            path: self.child_path(k),
                        },
                    ));
                }
                items.sort_by_key(|(i, _)| *i);
                Ok(items.into_iter().map(|(_, c)| c).collect())
            }
            _ => Err(self.error("expected a list")),
        }
    }

    /// A string; numbers and booleans are taken as written.
    pub fn string(&self) -> Result<String, ConfigError> {
        match self.value {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            _ => Err(self.error("expected a string")),
        }
    }

    /// A list of strings; a single string is a list of one.
    pub fn strings(&self) -> Result<Vec<String>, ConfigError> {
        match self.value {
            Value::String(_) | Value::Number(_) => Ok(vec![self.string()?]),
            _ => self.list()?.iter().map(|c| c.node().string()).collect(),
        }
    }

    /// One of `choices`, by name (ignoring case); the error lists them.
    pub fn one_of<T: Copy>(&self, choices: &[(&str, T)]) -> Result<T, ConfigError> {
        let text = self.string()?;
        choices
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text.trim()))
            .map(|(_, value)| *value)
            .ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
                self.error(format!(
                    "expected one of {}, got {text:?}",
                    names.join(", ")
                ))
            })
    }

    pub fn f64(&self) -> Result<f64, ConfigError> {
        let parsed = match self.value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        parsed
            .filter(|v| v.is_finite())
            .ok_or_else(|| self.error(format!("expected a number, got {}", self.value)))
    }

    /// A whole number in `min..=max`.
    pub fn integer(&self, min: i64, max: i64) -> Result<i64, ConfigError> {
        let parsed = match self.value {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        let n = parsed
            .ok_or_else(|| self.error(format!("expected a whole number, got {}", self.value)))?;
        if !(min..=max).contains(&n) {
            return Err(self.error(format!("must be between {min} and {max}, got {n}")));
        }
        Ok(n)
    }

    pub fn bool(&self) -> Result<bool, ConfigError> {
        match self.value {
            Value::Bool(b) => Ok(*b),
            Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Ok(true),
            Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Ok(false),
            _ => Err(self.error(format!("expected true or false, got {}", self.value))),
        }
    }

    /// A .NET TimeSpan in `min..=max`.
    pub fn timespan(&self, min: Duration, max: Duration) -> Result<Duration, ConfigError> {
        let text = self.string()?;
        let d = settings::parse_timespan(&text).map_err(|reason| self.error(reason))?;
        if d < min || d > max {
            return Err(self.error(format!(
                "must be between {} and {}, got {text}",
                format_timespan(min),
                format_timespan(max)
            )));
        }
        Ok(d)
    }
}

/// A duration as .NET prints a TimeSpan: `hh:mm:ss`, `d.hh:mm:ss`, fractions when present.
pub fn format_timespan(d: Duration) -> String {
    let secs = d.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let mut out = if days > 0 {
        format!("{days}.")
    } else {
        String::new()
    };
    out += &format!(
        "{:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    );
    let ticks = d.subsec_nanos() / 100;
    if ticks > 0 {
        out += &format!(".{ticks:07}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timespans_print_like_dotnet() {
        assert_eq!(format_timespan(Duration::from_secs(60)), "00:01:00");
        assert_eq!(format_timespan(Duration::from_secs(90_061)), "1.01:01:01");
        assert_eq!(
            format_timespan(Duration::from_millis(1500)),
            "00:00:01.5000000"
        );
    }

    #[test]
    fn values_are_read_leniently_with_their_path() {
        let v = json!({"Limits": {"actionCount": "3", "Flag": "True", "List": {"1": "b", "0": "a"}, "Bad": "x"}});
        let root = Node::new(&v, "Rule");
        let limits = root.get("limits").unwrap();
        let limits = limits.node();
        assert_eq!(
            limits.get("ActionCount").unwrap().node().integer(1, 10),
            Ok(3)
        );
        assert_eq!(limits.get("flag").unwrap().node().bool(), Ok(true));
        assert_eq!(
            limits.get("List").unwrap().node().strings().unwrap(),
            ["a", "b"]
        );
        let err = limits
            .get("Bad")
            .unwrap()
            .node()
            .integer(1, 10)
            .unwrap_err();
        assert_eq!(err.path, "Rule:Limits:Bad");
        assert!(err.to_string().contains("whole number"), "{err}");
        let err = limits
            .get("ActionCount")
            .unwrap()
            .node()
            .integer(5, 10)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Rule:Limits:actionCount: must be between 5 and 10, got 3"
        );
    }
}
