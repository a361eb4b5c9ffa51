# Writes the 2026 webhook corpus: each body in wire format, and expected.jsonl with its
# signature (app secret wa-corpus-test-app-secret) and the facts a parser must extract.
# Run it from anywhere: python3 tests/data/webhooks-2026/make.py
import json, hmac, hashlib, os
SECRET=b"wa-corpus-test-app-secret"
out=os.path.dirname(os.path.abspath(__file__))
META={"display_phone_number":"2347000000001","phone_number_id":"118822334455667"}
def wire(v):
    s=json.dumps(v,separators=(",",":"),ensure_ascii=True)
    return s.replace("/","\\/")
cases=[]
def case(name, body, items):
    b=wire(body).encode()
    open(os.path.join(out,name),"wb").write(b)
    sig="sha256="+hmac.new(SECRET,b,hashlib.sha256).hexdigest()
    cases.append({"file":name,"expect":"ack-200","wire_format":True,"bytes":len(b),"x_hub_signature_256":sig,"items":items})
def env(field, value, time=None):
    e={"id":"240011223344556","changes":[{"value":value,"field":field}]}
    if time: e["time"]=time
    return {"object":"whatsapp_business_account","entry":[e]}

# 1. The owner answers from the WhatsApp Business app (coexistence): two echoes.
case("01_smb_message_echoes_text_and_image_wire.json",
 env("smb_message_echoes",{"messaging_product":"whatsapp","metadata":META,"message_echoes":[
  {"from":"2347000000001","to":"2348051112222","to_user_id":"NG.3301928374650011","id":"wamid.ECHO01","timestamp":"1781100000","type":"text","text":{"body":"Na me, Bisi. Your order go reach today \U0001f64f"}},
  {"from":"2347000000001","to_user_id":"NG.3301928374650022","id":"wamid.ECHO02","timestamp":"1781100005","type":"image","image":{"id":"7700112233","mime_type":"image/jpeg","sha256":"q1w2e3","caption":"Your receipt"}}]}),
 [{"kind":"echo","field":"smb_message_echoes","phone_number_id":"118822334455667","id":"wamid.ECHO01","from":"2347000000001","to":"2348051112222","to_user_id":"NG.3301928374650011","type":"text","timestamp":1781100000,"text":"Na me, Bisi. Your order go reach today \U0001f64f","customer":"2348051112222","external_id":"echo:wamid.ECHO01"},
  {"kind":"echo","field":"smb_message_echoes","id":"wamid.ECHO02","to":None,"to_user_id":"NG.3301928374650022","type":"image","media_id":"7700112233","mime_type":"image/jpeg","caption":"Your receipt","text":"Your receipt","customer":"NG.3301928374650022"}])

# 2. A customer with a username: no number, a BSUID and a parent BSUID (linked portfolios).
case("02_text_bsuid_parent_username_no_phone_wire.json",
 env("messages",{"messaging_product":"whatsapp","metadata":META,
  "contacts":[{"profile":{"name":"Kemi","username":"kemi.bakes"},"user_id":"NG.4401928374650033","parent_user_id":"NG.ENT.99018273645"}],
  "messages":[{"from_user_id":"NG.4401928374650033","from_parent_user_id":"NG.ENT.99018273645","id":"wamid.BSUID01","timestamp":"1781100100","type":"text","text":{"body":"Abeg, how much be delivery to Ikeja?"}}]}),
 [{"kind":"message","id":"wamid.BSUID01","from":None,"from_user_id":"NG.4401928374650033","from_parent_user_id":"NG.ENT.99018273645","contact_name":"Kemi","type":"text","timestamp":1781100100,"text":"Abeg, how much be delivery to Ikeja?","customer":"NG.4401928374650033","state":"pending"}])

# 3. The same customer changes number: a system message names the new BSUID.
case("03_system_user_changed_user_id_wire.json",
 env("messages",{"messaging_product":"whatsapp","metadata":META,
  "messages":[{"from_user_id":"NG.4401928374650033","id":"wamid.SYS01","timestamp":"1781100200","type":"system","system":{"body":"Kemi changed their phone number","type":"user_changed_user_id","user_id":"NG.4401928374650044"}}]}),
 [{"kind":"message","id":"wamid.SYS01","from_user_id":"NG.4401928374650033","type":"system","system_type":"user_changed_user_id","system_new_user_id":"NG.4401928374650044","text":"Kemi changed their phone number","customer":"NG.4401928374650033","state":"skipped"}])

# 4. ...and writes from the new BSUID: the same customer's conversation.
case("04_text_new_bsuid_after_change_wire.json",
 env("messages",{"messaging_product":"whatsapp","metadata":META,
  "contacts":[{"profile":{"name":"Kemi"},"user_id":"NG.4401928374650044"}],
  "messages":[{"from_user_id":"NG.4401928374650044","id":"wamid.BSUID02","timestamp":"1781100300","type":"text","text":{"body":"Na me again, new phone"}}]}),
 [{"kind":"message","id":"wamid.BSUID02","from_user_id":"NG.4401928374650044","text":"Na me again, new phone","customer":"NG.4401928374650033","state":"pending"}])

# 5. Per-message pricing (PMP) on statuses, naming the recipient by number and BSUID.
case("05_statuses_pmp_pricing_bsuid_wire.json",
 env("messages",{"messaging_product":"whatsapp","metadata":META,"statuses":[
  {"id":"wamid.OUT01","status":"delivered","timestamp":"1781100400","recipient_id":"2348051112222","recipient_user_id":"NG.3301928374650011","pricing":{"billable":True,"pricing_model":"PMP","category":"utility","type":"regular"}},
  {"id":"wamid.OUT02","status":"read","timestamp":"1781100410","recipient_user_id":"NG.3301928374650022","pricing":{"billable":False,"pricing_model":"PMP","category":"service","type":"free_customer_service"}},
  {"id":"wamid.OUT03","status":"sent","timestamp":"1781100420","recipient_id":"2348051113333","pricing":{"pricing_model":"PMP","category":"marketing_lite","type":"free_entry_point"}}]}),
 [{"kind":"status","id":"wamid.OUT01","status":"delivered","recipient_id":"2348051112222","recipient_user_id":"NG.3301928374650011","pricing_category":"utility","pricing_type":"regular","pricing_billable":True,"customer":"2348051112222"},
  {"kind":"status","id":"wamid.OUT02","status":"read","recipient_id":None,"recipient_user_id":"NG.3301928374650022","pricing_category":"service","pricing_type":"free_customer_service","pricing_billable":False,"customer":"NG.3301928374650022"},
  {"kind":"status","id":"wamid.OUT03","status":"sent","pricing_category":"marketing_lite","pricing_type":"free_entry_point","pricing_billable":None,"customer":"2348051113333"}])

# 6. The app's past and its contacts: kept whole, never routed.
case("06_field_history_wire.json",
 env("history",{"messaging_product":"whatsapp","metadata":META,"history":[{"metadata":{"phase":0,"chunk_order":1,"progress":100},"threads":[{"id":"2348051114444","messages":[{"from":"2348051114444","id":"wamid.HIST01","timestamp":"1780000000","type":"text","text":{"body":"old message"},"history_context":{"status":"READ"}}]}]}]}, time=1781100500),
 [{"kind":"field_event","field":"history","entry_time":1781100500,"state":"recorded","customer":None}])
case("07_field_smb_app_state_sync_wire.json",
 env("smb_app_state_sync",{"messaging_product":"whatsapp","metadata":META,"state_sync":[{"type":"contact","contact":{"full_name":"Bisi Adeyemi","first_name":"Bisi","phone_number":"2348051112222"},"action":"add","metadata":{"timestamp":"1781100550"}}]}, time=1781100550),
 [{"kind":"field_event","field":"smb_app_state_sync","entry_time":1781100550,"state":"recorded"}])

with open(os.path.join(out,"expected.jsonl"),"w") as f:
    for c in cases:
        f.write(json.dumps(c, ensure_ascii=False)+"\n")
print(len(cases))
