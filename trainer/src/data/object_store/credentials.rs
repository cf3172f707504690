//! Where a store's client takes its credentials from, in `object_store`'s order of precedence
//! for that store; named in credential and permission errors. Holds variable names and
//! endpoints only, never a key, token or role.
use ::object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use ::object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use ::object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`).
    Keys { session_token: bool },
    /// IRSA: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, exchanged at STS.
    WebIdentity,
    /// ECS task role: `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`.
    EcsTask,
    /// EKS Pod Identity: `AWS_CONTAINER_CREDENTIALS_FULL_URI` + its token file.
    EksPodIdentity,
    /// No variables: the EC2 instance metadata service (IMDS) at this endpoint.
    InstanceMetadata { endpoint: String },
    /// Google Cloud Storage: what the `GOOGLE_*` variables (or their absence) select.
    Google(&'static str),
    /// Azure Blob Storage: what the `AZURE_*` variables (or their absence) select.
    Azure(&'static str),
}

impl CredentialSource {
    pub(super) fn of_s3(b: &AmazonS3Builder) -> Self {
        let has = |k: AmazonS3ConfigKey| b.get_config_value(&k).is_some();
        if has(AmazonS3ConfigKey::AccessKeyId) || has(AmazonS3ConfigKey::SecretAccessKey) {
            CredentialSource::Keys {
                session_token: has(AmazonS3ConfigKey::Token),
            }
        } else if has(AmazonS3ConfigKey::WebIdentityTokenFile) && has(AmazonS3ConfigKey::RoleArn) {
            CredentialSource::WebIdentity
        } else if has(AmazonS3ConfigKey::ContainerCredentialsRelativeUri) {
            CredentialSource::EcsTask
        } else if has(AmazonS3ConfigKey::ContainerCredentialsFullUri)
            && has(AmazonS3ConfigKey::ContainerAuthorizationTokenFile)
        {
            CredentialSource::EksPodIdentity
        } else {
            CredentialSource::InstanceMetadata {
                endpoint: b
                    .get_config_value(&AmazonS3ConfigKey::MetadataEndpoint)
                    .unwrap_or_else(|| "http://169.254.169.254".into()),
            }
        }
    }

    pub(super) fn of_gcs(b: &GoogleCloudStorageBuilder) -> Self {
        let has = |k: GoogleConfigKey| b.get_config_value(&k).is_some();
        CredentialSource::Google(if has(GoogleConfigKey::ServiceAccountKey) {
            "credentials from the service account key in GOOGLE_SERVICE_ACCOUNT_KEY"
        } else if has(GoogleConfigKey::ServiceAccount) {
            "credentials from the service account file named by GOOGLE_SERVICE_ACCOUNT"
        } else if has(GoogleConfigKey::ApplicationCredentials)
            || std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_some()
        {
            "credentials from the application default credentials file in GOOGLE_APPLICATION_CREDENTIALS"
        } else {
            "no GOOGLE_* credential variables set, so gcloud's application default credentials or else the instance metadata service"
        })
    }

    pub(super) fn of_azure(b: &MicrosoftAzureBuilder) -> Self {
        let has = |k: AzureConfigKey| b.get_config_value(&k).is_some();
        let yes = |k: AzureConfigKey| b.get_config_value(&k).is_some_and(|v| v == "true");
        CredentialSource::Azure(if yes(AzureConfigKey::UseEmulator) {
            "the emulator's account (AZURE_STORAGE_USE_EMULATOR)"
        } else if has(AzureConfigKey::Token) {
            "the bearer token in AZURE_STORAGE_TOKEN"
        } else if has(AzureConfigKey::AccessKey) {
            "the account key in AZURE_STORAGE_ACCOUNT_KEY"
        } else if has(AzureConfigKey::SasKey) {
            "the SAS token in AZURE_STORAGE_SAS_KEY"
        } else if has(AzureConfigKey::FederatedTokenFile) {
            "workload identity (AZURE_FEDERATED_TOKEN_FILE, AZURE_STORAGE_CLIENT_ID)"
        } else if has(AzureConfigKey::ClientSecret) {
            "the service principal in AZURE_STORAGE_CLIENT_ID/AZURE_STORAGE_CLIENT_SECRET"
        } else if yes(AzureConfigKey::UseAzureCli) {
            "the Azure CLI (AZURE_USE_AZURE_CLI)"
        } else {
            "no AZURE_* credential variables set, so the managed identity endpoint"
        })
    }
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Keys { session_token } => write!(
                f,
                "credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY{}",
                if *session_token { " with AWS_SESSION_TOKEN" } else { "" }
            ),
            CredentialSource::WebIdentity => write!(
                f,
                "credentials from the web identity token (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN) exchanged at STS"
            ),
            CredentialSource::EcsTask => write!(
                f,
                "credentials from the ECS task role (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)"
            ),
            CredentialSource::EksPodIdentity => write!(
                f,
                "credentials from EKS Pod Identity (AWS_CONTAINER_CREDENTIALS_FULL_URI)"
            ),
            CredentialSource::InstanceMetadata { endpoint } => write!(
                f,
                "no AWS_* credential variables set, so credentials from the instance metadata service at {endpoint}"
            ),
            CredentialSource::Google(s) | CredentialSource::Azure(s) => f.write_str(s),
        }
    }
}
