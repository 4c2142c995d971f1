#!/usr/bin/env python3
# Writes the VTN payloads the parser's unit tests read, as OpenLEADR 0.5.36 writes them.
from openleadr.messaging import create_message
from openleadr import objects
from datetime import datetime, timezone, timedelta
import sys, os
out_dir = sys.argv[1]
t = datetime(2026,12,4,18,0,tzinfo=timezone.utc)
def out(name, typ, **kw):
    open(os.path.join(out_dir, name+'.xml'),'w').write(create_message(typ, **kw))
ok = {'response_code':200,'response_description':'OK','request_id':'r9'}
def iv(start_min, dur_min, v):
    return objects.Interval(dtstart=t+timedelta(minutes=start_min), duration=timedelta(minutes=dur_min), signal_payload=v)
kw = lambda unit, scale: objects.Measurement(name='powerReal', description='RealPower', unit=unit, scale=scale, power_attributes=objects.PowerAttributes(hertz=60, voltage=230, ac=True))
def event(eid, mod, status, signals):
    e = objects.Event(
      event_descriptor=objects.EventDescriptor(event_id=eid, modification_number=mod, market_context='http://utility.example/dr', event_status=status, created_date_time=t),
      active_period=objects.ActivePeriod(dtstart=t, duration=timedelta(minutes=30)),
      event_signals=signals, targets=[objects.Target(ven_id='ven1')], response_required='always')
    # the status as given (OpenLEADR sets it from the clock when the event is built)
    e.event_descriptor.event_status = status
    return e
e1 = event('ev-simple', 2, 'active', [objects.EventSignal(signal_name='SIMPLE', signal_type='level', signal_id='s1', intervals=[iv(0,10,2), iv(10,20,1)])])
e2 = event('ev-dispatch', 0, 'far', [
  objects.EventSignal(signal_name='LOAD_DISPATCH', signal_type='delta', signal_id='s2', measurement=kw('W','k'), intervals=[iv(0,30,-50.0)]),
  objects.EventSignal(signal_name='LOAD_DISPATCH', signal_type='setpoint', signal_id='s3', measurement=kw('W','M'), intervals=[iv(0,30,1.5)]),
  objects.EventSignal(signal_name='ELECTRICITY_PRICE', signal_type='price', signal_id='s4', intervals=[iv(0,30,0.3)])])
e3 = event('ev-control', 1, 'cancelled', [
  objects.EventSignal(signal_name='LOAD_CONTROL', signal_type='x-loadControlCapacity', signal_id='s5', intervals=[iv(0,10,0.8), iv(10,20,0.5)]),
  objects.EventSignal(signal_name='LOAD_CONTROL', signal_type='x-loadControlPercentOffset', signal_id='s6', intervals=[iv(0,30,20)]),
  objects.EventSignal(signal_name='LOAD_CONTROL', signal_type='x-loadControlSetpoint', signal_id='s7', intervals=[iv(0,30,900)])])
out('distribute','oadrDistributeEvent', response=ok, request_id='req-7', vtn_id='vtn', events=[e1, e2, e3])
out('created_party_registration','oadrCreatedPartyRegistration', response=ok, ven_id='ven1', registration_id='reg1', vtn_id='vtn', profiles=[{'profile_name':'2.0b','transports':[{'transport_name':'simpleHttp'}]}], requested_oadr_poll_freq=timedelta(seconds=10))
out('request_reregistration','oadrRequestReregistration', ven_id='ven1')
out('response','oadrResponse', response={'response_code':200,'response_description':'OK','request_id':None}, ven_id='ven1')
rr = objects.ReportRequest(report_request_id='rr1', report_specifier=objects.ReportSpecifier(report_specifier_id='powerplane-meter', granularity=timedelta(seconds=2), report_back_duration=timedelta(seconds=4), specifier_payloads=[objects.SpecifierPayload(r_id='meter-power-w', reading_type='Direct Read')]))
out('registered_report','oadrRegisteredReport', response=ok, ven_id='ven1', report_requests=[rr])
out('create_report','oadrCreateReport', request_id='cr1', ven_id='ven1', report_requests=[rr])
out('cancel_party_registration','oadrCancelPartyRegistration', request_id='c1', registration_id='reg1', ven_id='ven1')
out('register_report','oadrRegisterReport', request_id='vr1', ven_id='ven1', reports=[])
