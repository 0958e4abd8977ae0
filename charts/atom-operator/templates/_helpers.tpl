{{/* Names and labels shared by every template. */}}

{{- define "atom-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's object name prefix; room is left for the longest suffix ("-webhook-tls", 12 characters). */}}
{{- define "atom-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 51 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 51 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 51 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "atom-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "atom-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "atom-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "atom-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "atom-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "atom-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "atom-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "atom-operator.engineImage" -}}
{{- printf "%s:%s" .Values.engine.image.repository (default .Chart.AppVersion .Values.engine.image.tag) }}
{{- end }}

{{- define "atom-operator.engineRngdImage" -}}
{{- printf "%s:%s" .Values.engine.rngdImage.repository (default .Chart.AppVersion .Values.engine.rngdImage.tag) }}
{{- end }}

{{- define "atom-operator.webhookService" -}}
{{- printf "%s-webhook" (include "atom-operator.fullname" .) }}
{{- end }}

{{- define "atom-operator.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "atom-operator.fullname" .) }}
{{- end }}

{{- define "atom-operator.certificate" -}}
{{- printf "%s-webhook" (include "atom-operator.fullname" .) }}
{{- end }}

{{/*
The webhook's CA, serving certificate and key (base64, as in a Secret's data), made once per render and kept
across upgrades: an existing Secret is reused as it is, so the caBundle never changes under a running API
server. Memoized in .Values because the Secret, the webhook configuration and the pod's checksum all need the
same certificate, and every genCA call makes a new one.
*/}}
{{- define "atom-operator.webhookTLS" -}}
{{- if not (hasKey .Values "_webhookTLS") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "atom-operator.webhookSecret" .) }}
{{- $data := dig "data" (dict) $existing }}
{{- $tls := dict }}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") }}
{{- $tls = dict "ca.crt" (index $data "ca.crt") "tls.crt" (index $data "tls.crt") "tls.key" (index $data "tls.key") }}
{{- else }}
{{- $svc := include "atom-operator.webhookService" . }}
{{- $ns := .Release.Namespace }}
{{- $days := int .Values.webhook.certValidityDays }}
{{- $ca := genCA (printf "%s webhook CA" (include "atom-operator.fullname" .)) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca }}
{{- $tls = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) }}
{{- end }}
{{- $_ := set .Values "_webhookTLS" $tls }}
{{- end }}
{{- toYaml (get .Values "_webhookTLS") }}
{{- end }}
