//! `clrscope generatekey`: a MonitorApiKey (key pair, subject, token) printed like dotnet-monitor's
//! `generatekey`, for the agent's configuration and its clients.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use serde_json::json;
use settings::parse_setting_duration;
use ui::auth::{generate_key, GeneratedKey};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How to print the settings: Json (to merge into settings.json), Text, Cmd, PowerShell or
    /// Shell (environment variables), MachineJson (one JSON object, settings and header).
    #[arg(short, long, value_enum, ignore_case = true, default_value = "Json")]
    output: Format,
    /// How long the token is valid: 7d, 12h, 30m…, or .NET's d.hh:mm:ss.
    #[arg(short, long, value_parser = parse_expiration, default_value = "7d")]
    expiration: Duration,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    #[value(name = "Json")]
    Json,
    #[value(name = "Text")]
    Text,
    #[value(name = "Cmd")]
    Cmd,
    #[value(name = "PowerShell")]
    PowerShell,
    #[value(name = "Shell")]
    Shell,
    #[value(name = "MachineJson")]
    MachineJson,
}

/// The environment variables the agent reads the key from.
const SUBJECT_VARIABLE: &str = "CLRSCOPE_Authentication__MonitorApiKey__Subject";
const PUBLIC_KEY_VARIABLE: &str = "CLRSCOPE_Authentication__MonitorApiKey__PublicKey";

/// A positive duration: `7d`, `12h`, … or .NET's TimeSpan `[d.]hh:mm[:ss]` (what
/// dotnet-monitor's `--expiration` takes).
fn parse_expiration(text: &str) -> Result<Duration, String> {
    let duration = parse_setting_duration(text)?;
    if duration.is_zero() {
        return Err("the expiration must be positive".into());
    }
    Ok(duration)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let expires = i64::try_from((now + args.expiration).as_secs())?;
    print!("{}", render(&generate_key(expires), args.output));
    Ok(())
}

fn render(key: &GeneratedKey, format: Format) -> String {
    let settings = json!({
        "Authentication": {
            "MonitorApiKey": {"Subject": key.subject, "PublicKey": key.public_key}
        }
    });
    let header = format!("Bearer {}", key.token);
    let pretty = |value: &serde_json::Value| {
        // A tree of strings always serializes.
        serde_json::to_string_pretty(value).unwrap_or_default()
    };
    if let Format::MachineJson = format {
        let mut machine = settings;
        machine["AuthorizationHeader"] = json!(header);
        return format!("{}\n", pretty(&machine));
    }
    let name = format!("{format:?}");
    let body = match format {
        Format::Json | Format::MachineJson => pretty(&settings),
        Format::Text => format!("Subject: {}\nPublic Key: {}", key.subject, key.public_key),
        Format::Cmd => format!(
            "set {SUBJECT_VARIABLE}={}\nset {PUBLIC_KEY_VARIABLE}={}",
            key.subject, key.public_key
        ),
        Format::PowerShell => format!(
            "$env:{SUBJECT_VARIABLE}=\"{}\"\n$env:{PUBLIC_KEY_VARIABLE}=\"{}\"",
            key.subject, key.public_key
        ),
        Format::Shell => format!(
            "export {SUBJECT_VARIABLE}=\"{}\"\nexport {PUBLIC_KEY_VARIABLE}=\"{}\"",
            key.subject, key.public_key
        ),
    };
    format!(
        "Generated ApiKey for clrscope; use the following header for authorization:\n\n\
         Authorization: {header}\n\nSettings in {name} format:\n{body}\n\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expirations_read_like_dotnet_monitors() {
        assert_eq!(parse_expiration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(
            parse_expiration("7.00:00:00"),
            Ok(Duration::from_secs(7 * 86400))
        );
        assert_eq!(parse_expiration("01:30"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_expiration("00:00:05"), Ok(Duration::from_secs(5)));
        for bad in ["0s", "00:00:00", "1:2:3:4", "x.01:00:00", "soon"] {
            assert!(parse_expiration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_format_carries_the_settings() {
        let key = GeneratedKey {
            token: "t.o.k".into(),
            subject: "sub".into(),
            public_key: "pk".into(),
        };
        let machine: serde_json::Value =
            serde_json::from_str(&render(&key, Format::MachineJson)).unwrap();
        assert_eq!(machine["AuthorizationHeader"], "Bearer t.o.k");
        assert_eq!(machine["Authentication"]["MonitorApiKey"]["Subject"], "sub");
        assert_eq!(
            machine["Authentication"]["MonitorApiKey"]["PublicKey"],
            "pk"
        );
        let shell = render(&key, Format::Shell);
        assert!(shell.contains("Authorization: Bearer t.o.k\n"), "{shell}");
        assert!(shell.contains("export CLRSCOPE_Authentication__MonitorApiKey__Subject=\"sub\""));
        let json = render(&key, Format::Json);
        let settings = json.split("Settings in Json format:\n").nth(1).unwrap();
        let settings: serde_json::Value = serde_json::from_str(settings.trim()).unwrap();
        assert_eq!(
            settings["Authentication"]["MonitorApiKey"]["PublicKey"],
            "pk"
        );
        assert!(render(&key, Format::Text).contains("Public Key: pk\n"));
        assert!(render(&key, Format::Cmd)
            .contains("set CLRSCOPE_Authentication__MonitorApiKey__PublicKey=pk"));
        assert!(render(&key, Format::PowerShell)
            .contains("$env:CLRSCOPE_Authentication__MonitorApiKey__Subject=\"sub\""));
    }
}
