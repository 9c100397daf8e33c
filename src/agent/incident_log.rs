//! One OTLP log record per incident, so it shows in the team's log backend beside the service's
//! own logs, with a link back to its page in the agent's web UI. It takes the exporters' log path
//! (their channel, interval and queue), as the agent's own message in category
//! [`INCIDENT_CATEGORY`], under the resource of the incident's first process.

use std::sync::Arc;

use exporter::otlp::LogExport;
use profile::budget::{Charged, SharedBudget};
use profile::labels;
use profile::log::{LogLevel, LogMessage, LogRecord};
use profile::signal::Signal;
use store::incidents::{Incident, Incidents};

use super::export::ExportTaps;

/// The record's category: its instrumentation scope.
pub const INCIDENT_CATEGORY: &str = "clrscope.incidents";
/// The record's event id and name.
const EVENT_ID: i32 = 1;
const EVENT_NAME: &str = "IncidentCreated";
const TEMPLATE: &str =
    "Incident {incident.id} on {incident.service_names} ({incident.process_ids}): \
                        {incident.rules}; see {incident.link}";

/// Exports a record of each incident made from now on through `taps`, when an exporter sends
/// logs. The records are not kept, so they are charged to no budget.
pub fn export_incidents(incidents: &Incidents, taps: ExportTaps, host_name: String) {
    if !taps.want_logs() {
        return;
    }
    let budget = SharedBudget::unlimited();
    incidents.on_created(Box::new(move |incident| {
        taps.offer_log(&incident_log(incident, &host_name, &budget));
    }));
}

/// The path of an incident's page in the agent's web UI.
pub fn incident_link(id: u64) -> String {
    format!("/#view=incidents&incident={id}")
}

/// `incident` as a Warning from [`INCIDENT_CATEGORY`] at its first cause, its facts as the
/// message's arguments (OTLP attributes `incident.*`).
pub fn incident_log(incident: &Incident, host_name: &str, budget: &SharedBudget) -> LogExport {
    let join = |items: Vec<String>| items.join(",");
    let rules = match incident.rules.is_empty() {
        true => "mark".to_string(),
        false => join(incident.rules.clone()),
    };
    let arguments: Vec<(String, String)> = [
        ("incident.id", incident.id.to_string()),
        ("incident.rules", rules),
        (
            "incident.process_ids",
            join(
                incident
                    .processes
                    .iter()
                    .map(|p| p.pid.to_string())
                    .collect(),
            ),
        ),
        (
            "incident.service_names",
            join(
                incident
                    .processes
                    .iter()
                    .map(|p| p.service_name.clone())
                    .collect(),
            ),
        ),
        ("incident.onset_unix_ms", incident.onset_unix_ms.to_string()),
        ("incident.from_unix_ms", incident.from_unix_ms.to_string()),
        ("incident.until_unix_ms", incident.until_unix_ms.to_string()),
        (
            "incident.trigger",
            incident.causes[0]
                .trigger
                .clone()
                .or_else(|| incident.causes[0].note.clone())
                .unwrap_or_default(),
        ),
        ("incident.link", incident_link(incident.id)),
        ("{OriginalFormat}", TEMPLATE.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let value = |key: &str| {
        let found = arguments.iter().find(|(k, _)| k == key);
        found.map_or("", |(_, v)| v.as_str())
    };
    let message = format!(
        "Incident {} on {} ({}): {}; see {}",
        incident.id,
        value("incident.service_names"),
        value("incident.process_ids"),
        value("incident.rules"),
        value("incident.link"),
    );
    let first = &incident.processes[0];
    let series: Arc<[(String, String)]> = vec![
        (labels::HOST_NAME.to_string(), host_name.to_string()),
        (labels::PROCESS_ID.to_string(), first.pid.to_string()),
        (labels::SERVICE_NAME.to_string(), first.service_name.clone()),
    ]
    .into();
    let record = LogRecord {
        unix_nanos: incident.first_cause_unix_ms.saturating_mul(1_000_000),
        message: LogMessage {
            level: LogLevel::Warning,
            factory_id: 0,
            category: INCIDENT_CATEGORY.to_string(),
            event_id: EVENT_ID,
            event_name: EVENT_NAME.to_string(),
            message,
            exception: None,
            arguments,
            trace: None,
        },
        scopes: Vec::new(),
        span: None,
        ids_from: None,
    };
    LogExport {
        series,
        signal: Signal::Log(Arc::new(Charged::new(record, budget.hold_nothing()))),
    }
}
