//! The reports the VTN asked of the VEN: the meter sampled every `granularity`, the
//! samples sent every `reportBackDuration` with `oadrUpdateReport`.

use telemetry::Timestamp;
use tokio_util::sync::CancellationToken;

use super::call::{check, CallError};
use super::parse::ReportRequest;
use super::payload;
use super::ven::{request_id, Session, Ven, MAX_SAMPLES};

/// A report the VTN asked for, and its samples not yet sent.
pub(super) struct Report {
    id: String,
    sample_s: f64,
    send_s: f64,
    pub(super) next_sample: Timestamp,
    pub(super) next_send: Timestamp,
    samples: Vec<(Timestamp, f64)>,
}

impl Report {
    pub(super) fn new(r: &ReportRequest, now: Timestamp) -> Report {
        let sample_s = r.granularity_s.filter(|s| *s >= 1.0).unwrap_or(60.0);
        let send_s = r
            .report_back_s
            .filter(|s| *s >= sample_s)
            .unwrap_or(sample_s);
        Report {
            id: r.report_request_id.clone(),
            sample_s,
            send_s,
            next_sample: now,
            next_send: now.plus_secs(send_s),
            samples: Vec::new(),
        }
    }
}

impl Ven {
    pub(super) async fn create_reports(
        &self,
        cancel: &CancellationToken,
        s: &mut Session,
        requests: &[ReportRequest],
        request_id: &str,
    ) -> Result<(), CallError> {
        if requests.is_empty() {
            return Ok(());
        }
        let t = (self.clock)();
        let mut pending = Vec::new();
        for r in requests {
            if r.r_ids.is_empty() || r.r_ids.iter().any(|id| id == payload::METER_RID) {
                s.reports.retain(|x| x.id != r.report_request_id);
                s.reports.push(Report::new(r, t));
                pending.push(r.report_request_id.clone());
            }
        }
        let body = payload::created_report(request_id, &s.ven_id, &pending);
        let answer = self.call(cancel, "EiReport", body).await?;
        check("EiReport", &answer)
    }

    pub(super) fn sample(&self, s: &mut Session, t: Timestamp) {
        for r in &mut s.reports {
            if t < r.next_sample {
                continue;
            }
            r.next_sample = t.plus_secs(r.sample_s);
            if let Some(w) = (self.meter)().filter(|w| w.is_finite()) {
                if r.samples.len() >= MAX_SAMPLES {
                    r.samples.remove(0);
                    self.counters.inc("openadr_samples_dropped_total");
                }
                r.samples.push((t, w));
            }
        }
    }

    pub(super) async fn send_reports(
        &self,
        cancel: &CancellationToken,
        s: &mut Session,
        t: Timestamp,
    ) -> Result<(), CallError> {
        for i in 0..s.reports.len() {
            if t < s.reports[i].next_send {
                continue;
            }
            s.reports[i].next_send = t.plus_secs(s.reports[i].send_s);
            if s.reports[i].samples.is_empty() {
                continue;
            }
            let body = payload::update_report(
                &request_id(),
                &s.ven_id,
                &s.reports[i].id,
                t,
                &s.reports[i].samples,
            );
            let answer = self.call(cancel, "EiReport", body).await?;
            check("EiReport", &answer)?;
            s.reports[i].samples.clear();
            self.counters.inc("openadr_reports_sent_total");
        }
        Ok(())
    }
}
