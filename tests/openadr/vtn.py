#!/usr/bin/env python3
"""An OpenADR 2.0b VTN for the VEN's end-to-end tests, on OpenLEADR's OpenADRServer.

It accepts any VEN's registration and asks every VEN for its TELEMETRY_USAGE report
(sampled every second). Commands come on stdin, one JSON object a line:

  {"cmd": "add", "id": "ev1", "signal": "SIMPLE", "type": "level",
   "intervals": [{"start_s": -5, "duration_s": 600, "value": 2}],
   "scale": "k", "market_context": "http://utility.example/dr"}
  {"cmd": "modify", "id": "ev1", "intervals": [...]}
  {"cmd": "cancel", "id": "ev1"}
  {"cmd": "forget"}          (the VEN's registration is dropped)

(`start_s`: seconds from now; `scale`: the siScaleCode of a LOAD_DISPATCH or
LOAD_CONTROL signal's powerReal). Events go to the VEN that registered last. What
happens is printed on stdout, one JSON object a line: {"ready": port},
{"registered": ven_id, ...}, {"polled": ven_id}, {"opted": ...},
{"created_event": [...]}, {"report": [values]}, {"done": cmd}, {"error": text}.
"""

import argparse
import asyncio
import json
import logging
import sys
import threading
import uuid
from datetime import datetime, timedelta, timezone

from openleadr import OpenADRServer, enums, hooks, objects, utils


def say(**kw):
    print(json.dumps(kw, default=str), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--poll-s", type=float, default=1.0)
    # HTTPS with client certificates (mutual TLS): the VTN's certificate and key, and
    # the CA file the VENs' certificates are checked against
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--ca")
    # check the XML signature of every message from a registered VEN (over TLS), as
    # OpenLEADR does by default
    ap.add_argument("--verify-signatures", action="store_true")
    # sign every message to the VENs with this certificate and key (XML signatures)
    ap.add_argument("--sign-cert")
    ap.add_argument("--sign-key")
    args = ap.parse_args()
    logging.getLogger("openleadr").setLevel(logging.ERROR)

    vens = {}  # ven_id -> registration_id
    fingerprints = {}  # ven_id -> its certificate's fingerprint (mutual TLS)
    last = {"ven": None}

    def ven_lookup(ven_id):
        if ven_id in vens:
            return {"ven_id": ven_id, "registration_id": vens[ven_id],
                    "fingerprint": fingerprints.get(ven_id)}
        return None

    server = OpenADRServer(vtn_id="powerplane-test-vtn", http_host=args.host,
                           http_port=args.port, ven_lookup=ven_lookup,
                           requested_poll_freq=timedelta(seconds=args.poll_s),
                           http_cert=args.cert, http_key=args.key, http_ca_file=args.ca,
                           verify_message_signatures=args.verify_signatures,
                           cert=args.sign_cert, key=args.sign_key)

    async def on_create_party_registration(info):
        ven_id = info.get("ven_id") or f"ven-{uuid.uuid4().hex[:8]}"
        registration_id = f"reg-{uuid.uuid4().hex[:8]}"
        vens[ven_id] = registration_id
        fingerprints[ven_id] = info.get("fingerprint")
        last["ven"] = ven_id
        say(registered=ven_id, registration_id=registration_id,
            ven_name=info.get("ven_name"), had_registration_id=info.get("registration_id"),
            fingerprint=info.get("fingerprint"))
        return ven_id, registration_id

    async def on_report(values):
        say(report=[v for _, v in values])

    async def on_register_report(ven_id, resource_id, measurement, unit, scale,
                                 min_sampling_interval, max_sampling_interval):
        say(report_offered=ven_id, resource_id=resource_id, measurement=measurement,
            unit=unit, scale=scale)
        return on_report, timedelta(seconds=1)

    server.add_handler("on_create_party_registration", on_create_party_registration)
    server.add_handler("on_register_report", on_register_report)

    async def before_handle(message_type, payload):
        if message_type == "oadrCreatedEvent":
            say(created_event=[{"event_id": r["event_id"],
                                "modification_number": r["modification_number"],
                                "opt_type": r["opt_type"],
                                "request_id": r.get("request_id"),
                                "description": r.get("response_description")}
                               for r in payload.get("event_responses", [])])
        elif message_type == "oadrPoll":
            say(polled=payload.get("ven_id"))
        elif message_type in ("oadrCreatedReport", "oadrRequestEvent", "oadrResponse",
                              "oadrQueryRegistration"):
            say(received=message_type)

    hooks.register("before_handle", before_handle)


    def intervals_of(spec):
        now = datetime.now(timezone.utc).replace(microsecond=0)
        return [objects.Interval(dtstart=now + timedelta(seconds=i["start_s"]),
                                 duration=timedelta(seconds=i["duration_s"]),
                                 signal_payload=i["value"], uid=n)
                for n, i in enumerate(spec)]

    def find(ven_id, event_id):
        return utils.find_by(server.events.get(ven_id, []), "event_descriptor.event_id", event_id)

    def opted(ven_id, event_id, opt_type):
        say(opted=event_id, ven_id=ven_id, opt_type=opt_type)

    def run(cmd):
        ven_id = last["ven"]
        if ven_id is None:
            raise ValueError("no VEN registered yet")
        if cmd["cmd"] == "add":
            intervals = intervals_of(cmd["intervals"])
            measurement = None
            if "scale" in cmd:
                measurement = objects.Measurement(
                    name="powerReal", description="RealPower", unit="W", scale=cmd["scale"],
                    power_attributes=objects.PowerAttributes(hertz=50, voltage=230, ac=True))
            signal = objects.EventSignal(intervals=intervals, signal_name=cmd["signal"],
                                         signal_type=cmd["type"], signal_id=uuid.uuid4().hex[:8],
                                         measurement=measurement)
            event = objects.Event(
                event_descriptor=objects.EventDescriptor(
                    event_id=cmd["id"], modification_number=0,
                    market_context=cmd.get("market_context", "http://utility.example/dr"),
                    event_status="far", created_date_time=datetime.now(timezone.utc)),
                active_period=utils.get_active_period_from_intervals(intervals, False),
                event_signals=[signal], targets=[objects.Target(ven_id=ven_id)],
                response_required="always")
            server.add_raw_event(ven_id=ven_id, event=event, callback=opted)
        elif cmd["cmd"] == "modify":
            event = find(ven_id, cmd["id"])
            if not event:
                raise ValueError(f"no event {cmd['id']}")
            intervals = intervals_of(cmd["intervals"])
            event.event_signals[0].intervals = intervals
            event.active_period = utils.get_active_period_from_intervals(intervals, False)
            utils.increment_event_modification_number(event)
            server.event_callbacks[cmd["id"]] = (event, opted)
            server.events_updated[ven_id] = True
        elif cmd["cmd"] == "forget":
            # the VTN no longer knows the VEN: its next call is answered with
            # oadrRequestReregistration
            del vens[ven_id]
        elif cmd["cmd"] == "cancel":
            server.cancel_event(ven_id, cmd["id"])
            server.event_callbacks[cmd["id"]] = (find(ven_id, cmd["id"]), opted)
        else:
            raise ValueError(f"unknown command {cmd['cmd']}")
        say(done=cmd["cmd"], id=cmd.get("id"))

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    def on_line(line):
        try:
            run(json.loads(line))
        except Exception as e:  # reported to the test, which fails on it
            say(error=f"{type(e).__name__}: {e}")

    def read_stdin():
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(on_line, line)

    threading.Thread(target=read_stdin, daemon=True).start()
    loop.run_until_complete(server.run())
    say(ready=args.port)
    loop.run_forever()


if __name__ == "__main__":
    main()
