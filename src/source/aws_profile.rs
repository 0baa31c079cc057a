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
//! `role_arn` assumes a role through STS (`AssumeRole`, signed with Signature Version 4) with
//! the credentials of `source_profile` (its keys, its `credential_process`, or a role it
//! assumes in turn) or of the environment (`credential_source = Environment`), taking
//! `role_session_name`, `external_id` and `duration_seconds`; the role's credentials are asked
//! for again before they expire. STS is reached at `AWS_ENDPOINT_URL_STS`, else
//! `AWS_ENDPOINT_URL`, else the profile's `endpoint_url`, else `sts.REGION.amazonaws.com`.
//! Other `credential_source`s (instance metadata, a container's) and SSO profiles are refused
//! in one line.

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
    match credentials(&profile, 0)? {
        Some(provider) => Ok(b.with_credentials(provider)),
        None => Ok(b),
    }
}

type Provider = Arc<dyn CredentialProvider<Credential = AwsCredential>>;

/// How many profiles a chain of `role_arn`s may pass through (the CLI refuses loops too).
const MAX_CHAIN: usize = 8;

/// What `profile` gives credentials by: its keys, its `credential_process`, or a role it
/// assumes; `None` where it gives none (object_store's own chain then applies).
fn credentials(profile: &Profile, depth: usize) -> Result<Option<Provider>> {
    let name = &profile.name;
    if let (Some(id), Some(secret)) = (
        profile.get("aws_access_key_id"),
        profile.get("aws_secret_access_key"),
    ) {
        let credential = AwsCredential {
            key_id: id.to_string(),
            secret_key: secret.to_string(),
            token: profile.get("aws_session_token").map(str::to_string),
        };
        return Ok(Some(Arc::new(object_store::StaticCredentialProvider::new(
            credential,
        ))));
    }
    if let Some(command) = profile.get("credential_process") {
        let process = ProcessCredentials {
            profile: name.clone(),
            command: command.to_string(),
            held: Held::default(),
        };
        return Ok(Some(Arc::new(process)));
    }
    if let Some(role) = profile.get("role_arn") {
        return Ok(Some(Arc::new(AssumedRole::of(profile, role, depth)?)));
    }
    if profile.get("sso_session").is_some() || profile.get("sso_start_url").is_some() {
        bail!(
            "AWS profile '{name}' signs in through SSO, which tensorfs does not do: give its credentials in the environment, as `eval \"$(aws configure export-credentials --profile {name} --format env)\"` does"
        );
    }
    Ok(None)
}

/// How long before its expiry a credential is asked for again, in seconds.
const RENEW_BEFORE: i64 = 300;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A credential held until shortly before it expires (for ever where it does not).
#[derive(Debug, Default)]
struct Held(Mutex<Option<(Arc<AwsCredential>, Option<i64>)>>);

impl Held {
    /// The credential held, unless it expires within [`RENEW_BEFORE`].
    fn fresh(&self) -> Option<Arc<AwsCredential>> {
        let held = self.0.lock().unwrap();
        let (c, expires) = held.as_ref()?;
        expires
            .is_none_or(|e| e - RENEW_BEFORE > now())
            .then(|| c.clone())
    }

    /// Holds `credential` (expiring at `expires`) from now on.
    fn keep(&self, (credential, expires): (AwsCredential, Option<i64>)) -> Arc<AwsCredential> {
        let credential = Arc::new(credential);
        *self.0.lock().unwrap() = Some((credential.clone(), expires));
        credential
    }
}

/// A credential that could not be had, as object_store's error.
fn failed(e: anyhow::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: e.into(),
    }
}

/// Credentials a profile's `credential_process` prints (the CLI's JSON, version 1), held until
/// shortly before they expire.
#[derive(Debug)]
struct ProcessCredentials {
    profile: String,
    command: String,
    /// The credential, and when it expires (seconds since the Unix epoch), if it does.
    held: Held,
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
        if let Some(c) = self.held.fresh() {
            return Ok(c);
        }
        let (profile, command) = (self.profile.clone(), self.command.clone());
        let got = tokio::task::spawn_blocking(move || run_process(&profile, &command))
            .await
            .map_err(|e| failed(e.into()))?
            .map_err(failed)?;
        Ok(self.held.keep(got))
    }
}

/// A role assumed through STS with a source profile's (or the environment's) credentials, held
/// until shortly before they expire.
struct AssumedRole {
    profile: String,
    role: String,
    session: String,
    external_id: Option<String>,
    duration: Option<String>,
    region: String,
    endpoint: url::Url,
    source: Provider,
    held: Held,
}

impl std::fmt::Debug for AssumedRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("AssumedRole"))
            .field("profile", &self.profile)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl AssumedRole {
    fn of(profile: &Profile, role: &str, depth: usize) -> Result<AssumedRole> {
        let name = &profile.name;
        if depth >= MAX_CHAIN {
            bail!("AWS profile '{name}': its roles' source profiles go round in a loop");
        }
        let source: Provider = match (
            profile.get("source_profile"),
            profile.get("credential_source"),
        ) {
            (Some(_), Some(_)) => bail!(
                "AWS profile '{name}' gives both source_profile and credential_source: give one"
            ),
            (Some(source), None) => {
                let from = load(source)?.ok_or_else(|| {
                    anyhow!("AWS profile '{name}': its source_profile '{source}' is in neither the credentials nor the config file")
                })?;
                // A source profile that is the profile itself gives its own keys (the CLI's
                // way of naming a role's long-term keys beside it).
                let from = match source == name.as_str() {
                    true => Profile {
                        name: from.name,
                        keys: (from.keys.into_iter())
                            .filter(|(k, _)| k != "role_arn")
                            .collect(),
                    },
                    false => from,
                };
                credentials(&from, depth + 1)?.ok_or_else(|| {
                    anyhow!(
                        "AWS profile '{name}': its source_profile '{source}' gives no credentials"
                    )
                })?
            }
            (None, Some(how)) if how.eq_ignore_ascii_case("Environment") => {
                let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
                let (Some(id), Some(secret)) =
                    (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
                else {
                    bail!(
                        "AWS profile '{name}' takes its credentials from the environment (credential_source = Environment), which has no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                    );
                };
                let credential = AwsCredential {
                    key_id: id,
                    secret_key: secret,
                    token: var("AWS_SESSION_TOKEN"),
                };
                Arc::new(object_store::StaticCredentialProvider::new(credential))
            }
            (None, Some(how)) => bail!(
                "AWS profile '{name}' assumes role {role} with credentials from {how} (credential_source), which tensorfs does not read: use source_profile, or credential_source = Environment"
            ),
            (None, None) => bail!(
                "AWS profile '{name}' assumes role {role} but names no source_profile or credential_source"
            ),
        };
        let region = (profile.get("sts_region").or(profile.get("region")))
            .map(str::to_string)
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = (std::env::var("AWS_ENDPOINT_URL_STS").ok())
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .filter(|e| !e.is_empty())
            .or_else(|| profile.get("endpoint_url").map(str::to_string))
            .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
        let endpoint = url::Url::parse(&endpoint)
            .map_err(|e| anyhow!("AWS profile '{name}': STS endpoint '{endpoint}': {e}"))?;
        Ok(AssumedRole {
            profile: name.clone(),
            role: role.to_string(),
            session: (profile.get("role_session_name").map(str::to_string))
                .unwrap_or_else(|| format!("tensorfs-{}", now())),
            external_id: profile.get("external_id").map(str::to_string),
            duration: profile.get("duration_seconds").map(str::to_string),
            region,
            endpoint,
            source,
            held: Held::default(),
        })
    }

    /// One `AssumeRole` call: the role's credential, and when it expires.
    async fn assume(&self) -> Result<(AwsCredential, Option<i64>)> {
        let what = || {
            format!(
                "AWS profile '{}': assuming role {}",
                self.profile, self.role
            )
        };
        let source = (self.source.get_credential().await).with_context(what)?;
        let body = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", "AssumeRole")
                .append_pair("Version", "2011-06-15")
                .append_pair("RoleArn", &self.role)
                .append_pair("RoleSessionName", &self.session);
            if let Some(id) = &self.external_id {
                form.append_pair("ExternalId", id);
            }
            if let Some(d) = &self.duration {
                form.append_pair("DurationSeconds", d);
            }
            form.finish()
        };
        let host = match (self.endpoint.host_str(), self.endpoint.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => bail!("{}: STS endpoint '{}' names no host", what(), self.endpoint),
        };
        let at = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let signed = sigv4(&source, &self.region, "sts", &host, &body, &at);
        crate::source::install_tls_provider();
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .with_context(what)?;
        let mut request = (client.post(self.endpoint.clone()))
            .header("content-type", FORM)
            .header("x-amz-date", &at)
            .header("authorization", signed);
        if let Some(token) = &source.token {
            request = request.header("x-amz-security-token", token);
        }
        let reply = request.body(body).send().await.with_context(what)?;
        let status = reply.status();
        let text = reply.text().await.with_context(what)?;
        if !status.is_success() {
            let why = match (xml_text(&text, "Code"), xml_text(&text, "Message")) {
                (Some(c), Some(m)) => format!("{c}: {m}"),
                (Some(c), None) => c,
                _ => text.lines().next().unwrap_or("").to_string(),
            };
            bail!("{}: STS answered {status}: {why}", what());
        }
        let (Some(id), Some(secret)) = (
            xml_text(&text, "AccessKeyId"),
            xml_text(&text, "SecretAccessKey"),
        ) else {
            bail!("{}: STS's answer holds no credentials", what());
        };
        let expires = xml_text(&text, "Expiration")
            .and_then(|e| chrono::DateTime::parse_from_rfc3339(&e).ok())
            .map(|e| e.timestamp());
        let credential = AwsCredential {
            key_id: id,
            secret_key: secret,
            token: xml_text(&text, "SessionToken"),
        };
        Ok((credential, expires))
    }
}

#[async_trait::async_trait]
impl CredentialProvider for AssumedRole {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        if let Some(c) = self.held.fresh() {
            return Ok(c);
        }
        let got = self.assume().await.map_err(failed)?;
        Ok(self.held.keep(got))
    }
}

/// The content type of an STS query (form-encoded POST).
const FORM: &str = "application/x-www-form-urlencoded";

/// The `Authorization` header of a form POST to `/` of `service` at `host`, signed with
/// Signature Version 4 at time `at` (`YYYYMMDDTHHMMSSZ`).
fn sigv4(
    c: &AwsCredential,
    region: &str,
    service: &str,
    host: &str,
    body: &str,
    at: &str,
) -> String {
    use sha2::{Digest, Sha256};
    let hex = |b: &[u8]| crate::source::hex(b);
    let mut headers = vec![
        ("content-type", FORM.to_string()),
        ("host", host.to_string()),
        ("x-amz-date", at.to_string()),
    ];
    if let Some(token) = &c.token {
        headers.push(("x-amz-security-token", token.clone()));
    }
    let canonical_headers: String = (headers.iter())
        .map(|(k, v)| format!("{k}:{v}\n"))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
    let signed = signed.join(";");
    let request = format!(
        "POST\n/\n\n{canonical_headers}\n{signed}\n{}",
        hex(&Sha256::digest(body.as_bytes()))
    );
    let day = &at[..8];
    let scope = format!("{day}/{region}/{service}/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{at}\n{scope}\n{}",
        hex(&Sha256::digest(request.as_bytes()))
    );
    let mac = |key: &[u8], data: &str| -> Vec<u8> {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        ring::hmac::sign(&key, data.as_bytes()).as_ref().to_vec()
    };
    let mut key = mac(format!("AWS4{}", c.secret_key).as_bytes(), day);
    for part in [region, service, "aws4_request"] {
        key = mac(&key, part);
    }
    let signature = hex(&mac(&key, &to_sign));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        c.key_id
    )
}

/// The text of the first element `tag` of an XML answer, its entities unescaped.
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    let text = &xml[start..end];
    Some(
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
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

    #[test]
    fn a_sigv4_signature_is_the_documented_one() {
        // AWS's Signature Version 4 test suite, "post-x-www-form-urlencoded" (its key, time
        // and body; its request signs content-type, host and x-amz-date as this one does).
        let c = AwsCredential {
            key_id: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            token: None,
        };
        let auth = sigv4(
            &c,
            "us-east-1",
            "service",
            "example.amazonaws.com",
            "Param1=value1",
            "20150830T123600Z",
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
        );
    }

    #[test]
    fn sts_answers_are_read_by_their_elements() {
        let xml = "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>ASIA1</AccessKeyId><SecretAccessKey>a/b+c&amp;d</SecretAccessKey></Credentials></AssumeRoleResult></AssumeRoleResponse>";
        assert_eq!(xml_text(xml, "AccessKeyId").as_deref(), Some("ASIA1"));
        assert_eq!(xml_text(xml, "SecretAccessKey").as_deref(), Some("a/b+c&d"));
        assert_eq!(xml_text(xml, "SessionToken"), None);
    }
}
