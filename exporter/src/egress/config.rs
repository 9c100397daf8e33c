//! The `Egress` section of settings.json, read with dotnet-monitor's keys.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::time::Duration;

use serde::Deserialize;
use settings::lenient;

/// The artifacts' disk budget unless `Egress:DiskBudget:MaxBytes` says otherwise: room for a
/// few traces and gcdumps or one dump of a mid-sized service, little enough that a rule firing
/// for ever cannot fill a node's disk or a pod's emptyDir.
pub const DEFAULT_DISK_BUDGET_BYTES: u64 = 2 << 30;

/// `Egress`: named providers of each type, as dotnet-monitor reads them
/// (`Egress:FileSystem:<name>:…`, `Egress:S3Storage:<name>:…`, `Egress:Properties`), plus
/// clrscope's own `Egress:DiskBudget`. Keys are read in PascalCase or camelCase; numbers and
/// booleans as JSON values or as strings (environment variables are strings).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct EgressConfig {
    #[serde(default, alias = "fileSystem")]
    pub file_system: BTreeMap<String, FileSystemOptions>,
    #[serde(default, alias = "s3Storage")]
    pub s3_storage: BTreeMap<String, S3Options>,
    #[serde(default, alias = "azureBlobStorage")]
    pub azure_blob_storage: BTreeMap<String, AzureBlobOptions>,
    /// Shared values (secrets) providers name: an Azure Blob provider's `AccountKeyName`,
    /// `SharedAccessSignatureName` and `QueueSharedAccessSignatureName` are keys of this map.
    #[serde(default, alias = "properties")]
    pub properties: BTreeMap<String, String>,
    #[serde(default, alias = "diskBudget")]
    pub disk_budget: DiskBudgetOptions,
}

/// `Egress:FileSystem:<name>` (dotnet-monitor's `FileSystemEgressProviderOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct FileSystemOptions {
    /// Where artifacts land (created 0700 if missing).
    #[serde(alias = "directoryPath")]
    pub directory_path: PathBuf,
    /// Where artifacts are written first, then renamed into `DirectoryPath` once complete (same
    /// file system for an atomic rename), so a reader of `DirectoryPath` never sees half a file.
    #[serde(default, alias = "intermediateDirectoryPath")]
    pub intermediate_directory_path: Option<PathBuf>,
    /// Bytes copied at a time (1 or more).
    #[serde(
        default,
        alias = "copyBufferSize",
        deserialize_with = "lenient::opt_bytes"
    )]
    pub copy_buffer_size: Option<u64>,
}

/// `Egress:S3Storage:<name>` (dotnet-monitor's `S3StorageEgressProviderOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct S3Options {
    /// The service URL, e.g. `http://127.0.0.1:9000`; empty: AWS (`https://s3.<region>.amazonaws.com`).
    #[serde(default, alias = "endpoint")]
    pub endpoint: Option<String>,
    #[serde(alias = "bucketName")]
    pub bucket_name: String,
    /// Default: `AWS_REGION`, else `us-east-1`.
    #[serde(default, alias = "regionName")]
    pub region_name: Option<String>,
    /// With `SecretAccessKey`; without both, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
    /// `AWS_SESSION_TOKEN` from the agent's environment.
    #[serde(default, alias = "accessKeyId")]
    pub access_key_id: Option<String>,
    #[serde(default, alias = "secretAccessKey")]
    pub secret_access_key: Option<String>,
    /// AWS profile files are not read: a configured profile is refused with an explanation.
    #[serde(default, alias = "awsProfileName")]
    pub aws_profile_name: Option<String>,
    #[serde(default, alias = "awsProfilePath")]
    pub aws_profile_path: Option<String>,
    /// When set (a .NET TimeSpan such as `01:00:00`, 1 minute to 1 day), the operation's
    /// resource location is a pre-signed GET URL valid that long; else `BucketName=…, Key=…`.
    #[serde(
        default,
        alias = "preSignedUrlExpiry",
        deserialize_with = "lenient::opt_duration"
    )]
    pub pre_signed_url_expiry: Option<Duration>,
    /// Path-style URLs (`endpoint/bucket/key`), as S3-compatible servers usually need.
    #[serde(
        default,
        alias = "forcePathStyle",
        deserialize_with = "lenient::boolean"
    )]
    pub force_path_style: bool,
    /// The multipart upload's part size; at least 5 MiB (S3's minimum), default 5 MiB.
    #[serde(
        default,
        alias = "copyBufferSize",
        deserialize_with = "lenient::opt_bytes"
    )]
    pub copy_buffer_size: Option<u64>,
    /// SSE-KMS is not supported: `true` is refused with an explanation.
    #[serde(
        default,
        alias = "useKmsEncryption",
        deserialize_with = "lenient::boolean"
    )]
    pub use_kms_encryption: bool,
    #[serde(default, alias = "kmsEncryptionKey")]
    pub kms_encryption_key: Option<String>,
}

/// `Egress:AzureBlobStorage:<name>` (dotnet-monitor's `AzureBlobEgressProviderOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AzureBlobOptions {
    /// The blob service, `https://<account>.blob.core.windows.net` (or an emulator's
    /// `http://127.0.0.1:10000/devstoreaccount1`).
    #[serde(alias = "accountUri")]
    pub account_uri: String,
    #[serde(alias = "containerName")]
    pub container_name: String,
    /// Blobs are named `<BlobPrefix>/<artifact file name>`.
    #[serde(default, alias = "blobPrefix")]
    pub blob_prefix: Option<String>,
    /// The storage account's key (Shared Key), base64; or `AccountKeyName`, the name of an
    /// `Egress:Properties` entry holding it.
    #[serde(default, alias = "accountKey")]
    pub account_key: Option<String>,
    #[serde(default, alias = "accountKeyName")]
    pub account_key_name: Option<String>,
    /// A SAS token (`sv=…&sig=…`), used before an account key; or `SharedAccessSignatureName`.
    #[serde(default, alias = "sharedAccessSignature")]
    pub shared_access_signature: Option<String>,
    #[serde(default, alias = "sharedAccessSignatureName")]
    pub shared_access_signature_name: Option<String>,
    /// Managed and workload identity need Azure's instance metadata service or a federated token:
    /// refused with an explanation (use a SAS or an account key).
    #[serde(default, alias = "managedIdentityClientId")]
    pub managed_identity_client_id: Option<String>,
    #[serde(
        default,
        alias = "useWorkloadIdentityFromEnvironment",
        deserialize_with = "lenient::boolean"
    )]
    pub use_workload_identity_from_environment: bool,
    /// With `QueueAccountUri`: after each upload a message holding the blob's name is put on this
    /// queue (created if missing).
    #[serde(default, alias = "queueName")]
    pub queue_name: Option<String>,
    #[serde(default, alias = "queueAccountUri")]
    pub queue_account_uri: Option<String>,
    /// The queue's own SAS (else the blob one, else the account key).
    #[serde(default, alias = "queueSharedAccessSignature")]
    pub queue_shared_access_signature: Option<String>,
    #[serde(default, alias = "queueSharedAccessSignatureName")]
    pub queue_shared_access_signature_name: Option<String>,
    /// dotnet-monitor's blob metadata: name → an environment variable of the target process,
    /// whose value becomes the metadata value of each blob from that process.
    #[serde(default, alias = "metadata")]
    pub metadata: BTreeMap<String, String>,
    /// The block size: blocks of this many bytes are uploaded, then committed together (default
    /// 4 MiB, at most 100 MiB).
    #[serde(
        default,
        alias = "copyBufferSize",
        deserialize_with = "lenient::opt_bytes"
    )]
    pub copy_buffer_size: Option<u64>,
    /// clrscope's own: how often a failed request is tried again (default 3, as the Azure SDK),
    /// with exponential back-off from 0.8 s.
    #[serde(
        default,
        alias = "maxRetries",
        deserialize_with = "lenient::opt_number"
    )]
    pub max_retries: Option<u32>,
}

/// `Egress:DiskBudget` (clrscope's own): the most bytes the artifacts written to FileSystem
/// providers' folders may take together. The oldest artifacts are deleted to make room for new
/// ones; an artifact larger than the whole budget fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiskBudgetOptions {
    /// Bytes, as a number or a string with an optional unit (`500MB`, `2GiB`).
    #[serde(alias = "maxBytes", deserialize_with = "lenient::bytes")]
    pub max_bytes: u64,
}

impl Default for DiskBudgetOptions {
    fn default() -> Self {
        DiskBudgetOptions {
            max_bytes: DEFAULT_DISK_BUDGET_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_dotnet_monitor_keys() {
        let json = r#"{
            "FileSystem": {"artifacts": {"DirectoryPath": "/diag/out", "IntermediateDirectoryPath": "/diag/tmp", "CopyBufferSize": "8192"}},
            "S3Storage": {"bucket": {"endpoint": "http://127.0.0.1:9000", "bucketName": "b", "accessKeyId": "k", "secretAccessKey": "s", "forcePathStyle": "true", "copyBufferSize": 6000000}},
            "DiskBudget": {"MaxBytes": "500MB"}
        }"#;
        let config: EgressConfig = serde_json::from_str(json).unwrap();
        let fs = &config.file_system["artifacts"];
        assert_eq!(fs.directory_path, PathBuf::from("/diag/out"));
        assert_eq!(fs.copy_buffer_size, Some(8192));
        let s3 = &config.s3_storage["bucket"];
        assert!(s3.force_path_style);
        assert_eq!(s3.copy_buffer_size, Some(6_000_000));
        assert_eq!(config.disk_budget.max_bytes, 500_000_000);
        let empty: EgressConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(empty.disk_budget.max_bytes, DEFAULT_DISK_BUDGET_BYTES);
        assert!(
            serde_json::from_str::<EgressConfig>(r#"{"DiskBudget":{"MaxBytes":"lots"}}"#).is_err()
        );
    }
}
