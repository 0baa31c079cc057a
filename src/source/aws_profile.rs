//! S3 credentials and settings as the AWS CLI reads them from its files, beside what
//! object_store reads itself (the environment's keys, web identity, instance metadata): a user
//! whose `aws s3 ls` works mounts with the same profile.
//!
//! The profile is `aws_profile=NAME` (a mount option), else `AWS_PROFILE`, else `default`. Its
//! keys are read from the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//! `~/.aws/credentials`, section `[NAME]`) and the config file (`AWS_CONFIG_FILE`, else
//! `~/.aws/config`, section `[profile NAME]`, or `[default]`), the credentials file's first:
//! `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`, `credential_process`
//! (run, and run again before what it gave expires), `region`, `endpoint_url`. What the mount
//! options or the environment give wins, as in the CLI, except that a profile named by the
//! mount option wins over the environment's keys.
//!
//! `role_arn` (a role assumed through STS) is not done: such a profile is refused in one line
//! saying how to hand its credentials over instead.

use anyhow::{Context, Result, anyhow, bail};
use object_store::CredentialProvider;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsCredential};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The mount option that names a profile (no object_store key: taken out before the rest).
pub(crate) const OPTION: &str = "aws_profile";

/// One profile's keys, the credentials file's over the config file's.
#[derive(Debug, Default)]
struct Profile {
    name: String,
    keys: HashMap<String, String>,
}

impl Profile {
    fn get(&self, key: &str) -> Option<&str> {
        self.keys
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

fn home_file(env: &str, rest: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".aws").join(rest))
}

/// The sections of an INI file (`[name]`, then `key = value` lines; `#` and `;` comments),
/// keys lower-cased. A line indented under a key continues it (the CLI's nested `s3 =` blocks),
/// and is left out.
fn sections(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let (Some(section), Some((k, v))) = (&current, trimmed.split_once('=')) else {
            continue;
        };
        (out.entry(section.clone()).or_default())
            .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    out
}

/// The profile `name`, from the credentials and config files; `None` where neither has it.
fn load(name: &str) -> Result<Option<Profile>> {
    let read = |path: Option<PathBuf>| -> Result<HashMap<String, HashMap<String, String>>> {
        let Some(path) = path else {
            return Ok(HashMap::new());
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(sections(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
            Err(e) => Err(anyhow!("'{}' cannot be read: {e}", path.display())),
        }
    };
    let credentials = read(home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials"))?;
    let config = read(home_file("AWS_CONFIG_FILE", "config"))?;
    let in_config = match name {
        "default" => config
            .get("default")
            .or_else(|| config.get("profile default")),
        _ => config.get(&format!("profile {name}")),
    };
    let in_credentials = credentials.get(name);
    if in_config.is_none() && in_credentials.is_none() {
        return Ok(None);
    }
    let mut keys = in_config.cloned().unwrap_or_default();
    keys.extend(in_credentials.cloned().unwrap_or_default());
    Ok(Some(Profile {
        name: name.to_string(),
        keys,
    }))
}

/// `builder` (the environment's and the mount options' settings applied) with what the
/// profile gives and they do not. `option`: the profile the mount option names.
pub(crate) fn apply(builder: AmazonS3Builder, option: Option<&str>) -> Result<AmazonS3Builder> {
    let env = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let named = option.map(str::to_string).or(env);
    let name = named.clone().unwrap_or_else(|| "default".into());
    let has = |b: &AmazonS3Builder, k: AmazonS3ConfigKey| b.get_config_value(&k).is_some();
    // Keys the mount options or the environment give: the profile's are not asked for, unless
    // the mount option names one.
    let keyed = has(&builder, AmazonS3ConfigKey::AccessKeyId)
        || std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_some();
    let Some(profile) = load(&name)? else {
        if named.is_some() && !keyed {
            bail!(
                "AWS profile '{name}' is in neither the credentials nor the config file (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, ~/.aws/)"
            );
        }
        return Ok(builder);
    };
    let mut b = builder;
    if !has(&b, AmazonS3ConfigKey::Region)
        && let Some(region) = profile.get("region")
    {
        b = b.with_region(region);
    }
    if !has(&b, AmazonS3ConfigKey::Endpoint)
        && let Some(endpoint) = profile.get("endpoint_url")
    {
        // An endpoint on plain HTTP (an emulator, a local gateway) is what the profile asks for.
        if endpoint.starts_with("http://") {
            b = b.with_allow_http(true);
        }
        b = b.with_endpoint(endpoint);
    }
    if keyed && option.is_none() {
        return Ok(b);
    }
    if let (Some(id), Some(secret)) = (
        profile.get("aws_access_key_id"),
        profile.get("aws_secret_access_key"),
    ) {
        let credential = AwsCredential {
            key_id: id.to_string(),
            secret_key: secret.to_string(),
            token: profile.get("aws_session_token").map(str::to_string),
        };
        let fixed = object_store::StaticCredentialProvider::new(credential);
        return Ok(b.with_credentials(Arc::new(fixed)));
    }
    if let Some(command) = profile.get("credential_process") {
        let process = ProcessCredentials {
            profile: profile.name.clone(),
            command: command.to_string(),
            held: Mutex::new(None),
        };
        return Ok(b.with_credentials(Arc::new(process)));
    }
    if let Some(role) = profile.get("role_arn") {
        bail!(
            "AWS profile '{name}' assumes role {role} (role_arn), which tensorfs does not do: give the role's credentials in the environment, as `eval \"$(aws configure export-credentials --profile {name} --format env)\"` does"
        );
    }
    Ok(b)
}

/// How long before its expiry a credential is asked for again, in seconds.
const RENEW_BEFORE: i64 = 300;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Credentials a profile's `credential_process` prints (the CLI's JSON, version 1), held until
/// shortly before they expire.
#[derive(Debug)]
struct ProcessCredentials {
    profile: String,
    command: String,
    /// The credential, and when it expires (seconds since the Unix epoch), if it does.
    held: Mutex<Option<(Arc<AwsCredential>, Option<i64>)>>,
}

/// Runs a profile's `credential_process`: its credential, and when it expires.
fn run_process(profile: &str, command: &str) -> Result<(AwsCredential, Option<i64>)> {
    let what = || format!("credential_process of AWS profile '{profile}' ({command})");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(what)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "{} exited with {}: {}",
            what(),
            out.status,
            err.lines().last().unwrap_or("")
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} printed no JSON", what()))?;
    let field = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
    let (Some(id), Some(secret)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        bail!("{} printed no AccessKeyId and SecretAccessKey", what());
    };
    let expires = field("Expiration")
        .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
        .map(|e| e.timestamp());
    Ok((
        AwsCredential {
            key_id: id.to_string(),
            secret_key: secret.to_string(),
            token: field("SessionToken").map(str::to_string),
        },
        expires,
    ))
}

#[async_trait::async_trait]
impl CredentialProvider for ProcessCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        if let Some((c, expires)) = self.held.lock().unwrap().as_ref()
            && expires.is_none_or(|e| e - RENEW_BEFORE > now())
        {
            return Ok(c.clone());
        }
        let (profile, command) = (self.profile.clone(), self.command.clone());
        let failed = |e: anyhow::Error| object_store::Error::Generic {
            store: "S3",
            source: e.into(),
        };
        let (credential, expires) =
            tokio::task::spawn_blocking(move || run_process(&profile, &command))
                .await
                .map_err(|e| failed(e.into()))?
                .map_err(failed)?;
        let credential = Arc::new(credential);
        *self.held.lock().unwrap() = Some((credential.clone(), expires));
        Ok(credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_read_as_the_cli_reads_them() {
        let s = sections(
            "[default]\nregion = eu-west-1\n# a comment\n[profile  dev]\naws_access_key_id=AK\n  nested = x\ns3 =\n  addressing_style = path\n; other\n",
        );
        assert_eq!(s["default"]["region"], "eu-west-1");
        assert_eq!(s["profile dev"]["aws_access_key_id"], "AK");
        assert!(!s["profile dev"].contains_key("nested"));
        assert!(!s["profile dev"].contains_key("addressing_style"));
    }
}
