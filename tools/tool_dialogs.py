#!/usr/bin/env python3
"""Synthetic tool-use dialogs for the embedded default model (tools/train_default_model.py trains on them).

Each dialog is an OpenAI-style conversation plus the tools offered in it:
- a request one of the offered tools serves: the assistant calls it with the arguments taken from the request, the
  tool answers, the assistant answers from the tool's result;
- a request none of the offered tools serves (or no tools at all): the assistant answers in text and calls nothing.
Pure Python and deterministic for a seed, so the training run (device) and the tests (here) draw the same dialogs.
`held_out=True` draws from a disjoint seed space and mixes in entities the training dialogs never contain, so the
rate measured on them says whether the model learned to copy arguments rather than memorise them.

usage: python3 tools/tool_dialogs.py [N] [--held-out]   prints N dialogs as JSON lines
"""
import json
import random
import sys

CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Seoul", "Dublin",
          "Vienna", "Prague", "Lisbon", "Athens", "Warsaw", "Toronto", "Sydney", "Nairobi", "Denver"]
CITIES_HELD_OUT = ["Helsinki", "Bogota", "Zurich", "Hanoi", "Quito", "Perth"]
TIMEZONES = ["Europe/Paris", "Asia/Tokyo", "America/New_York", "Europe/London", "Australia/Sydney", "Africa/Cairo",
             "America/Chicago", "Asia/Seoul"]
TIMEZONES_HELD_OUT = ["Europe/Oslo", "Asia/Dubai"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK"]
SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "IBM", "INTC", "ORCL", "META"]
SYMBOLS_HELD_OUT = ["AMD", "SAP"]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
NAMES_HELD_OUT = ["mallory", "oscar"]
SUBJECTS = ["lunch", "the report", "budget", "meeting notes", "travel plans", "the release", "holidays"]
PATHS = ["notes.txt", "README.md", "config.json", "todo.txt", "data.csv", "main.py", "setup.cfg"]
PATHS_HELD_OUT = ["log.txt", "plan.md"]
DIRS = ["src", "docs", "tests", "build", "tools", "home"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Japanese", "Dutch"]
PHRASES = ["good morning", "thank you", "where is the station", "see you tomorrow", "how are you", "happy birthday"]
TASKS = ["call mom", "buy milk", "water the plants", "pay the rent", "book a dentist", "send the invoice"]
TIMES = ["08:00", "09:30", "12:00", "15:45", "18:00", "21:15"]
TOPICS = ["json", "os.path", "collections", "itertools", "random", "datetime", "re", "pathlib", "shutil", "csv"]
CONDITIONS = ["sunny", "cloudy", "raining", "snowing", "windy", "foggy"]


def obj(props, required):
    return {"type": "object", "properties": props, "required": required}


S = {"type": "string"}
N = {"type": "integer"}

TOOLS = {
    "get_weather": ("Get the current weather in a city", obj({"city": S}, ["city"])),
    "add_numbers": ("Add two integers", obj({"a": N, "b": N}, ["a", "b"])),
    "multiply_numbers": ("Multiply two integers", obj({"a": N, "b": N}, ["a", "b"])),
    "get_time": ("Get the current time in a time zone", obj({"timezone": S}, ["timezone"])),
    "convert_currency": ("Convert an amount between currencies",
                         obj({"amount": N, "from_currency": S, "to_currency": S},
                             ["amount", "from_currency", "to_currency"])),
    "get_stock_price": ("Get the latest price of a stock", obj({"symbol": S}, ["symbol"])),
    "send_email": ("Send an email", obj({"to": S, "subject": S}, ["to", "subject"])),
    "read_file": ("Read a text file", obj({"path": S}, ["path"])),
    "list_directory": ("List the files in a directory", obj({"path": S}, ["path"])),
    "translate_text": ("Translate text into another language",
                       obj({"text": S, "target_language": S}, ["text", "target_language"])),
    "set_reminder": ("Set a reminder", obj({"text": S, "time": S}, ["text", "time"])),
    "search_docs": ("Search the Python documentation", obj({"query": S}, ["query"])),
}


def tool_schema(name):
    description, parameters = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def pick(r, pool, held_pool, held_out):
    if held_out and held_pool and r.random() < 0.5:
        return r.choice(held_pool)
    return r.choice(pool)


def request_for(r, name, held_out):
    """(user text, arguments, tool result, final answer) for a request the tool serves."""
    if name == "get_weather":
        city = pick(r, CITIES, CITIES_HELD_OUT, held_out)
        t, cond = r.randint(-5, 35), r.choice(CONDITIONS)
        ask = r.choice([f"What is the weather in {city}?", f"How is the weather in {city} today?",
                        f"Is it cold in {city} right now?", f"Tell me the weather for {city}."])
        return ask, {"city": city}, {"temperature": t, "condition": cond}, f"It is {t} degrees and {cond} in {city}."
    if name in ("add_numbers", "multiply_numbers"):
        a, b = r.randint(2, 999), r.randint(2, 999)
        if name == "add_numbers":
            ask = r.choice([f"What is {a} plus {b}?", f"Add {a} and {b}.", f"Compute the sum of {a} and {b}."])
            res = a + b
            return ask, {"a": a, "b": b}, {"result": res}, f"{a} plus {b} is {res}."
        ask = r.choice([f"What is {a} times {b}?", f"Multiply {a} by {b}.", f"Compute the product of {a} and {b}."])
        res = a * b
        return ask, {"a": a, "b": b}, {"result": res}, f"{a} times {b} is {res}."
    if name == "get_time":
        tz = pick(r, TIMEZONES, TIMEZONES_HELD_OUT, held_out)
        tm = r.choice(TIMES)
        ask = r.choice([f"What time is it in {tz}?", f"Tell me the current time in {tz}."])
        return ask, {"timezone": tz}, {"time": tm}, f"It is {tm} in {tz}."
    if name == "convert_currency":
        amount = r.randint(1, 5000)
        src, dst = r.sample(CURRENCIES, 2)
        out = round(amount * r.uniform(0.5, 1.5), 2)
        ask = r.choice([f"Convert {amount} {src} to {dst}.", f"How much is {amount} {src} in {dst}?"])
        return (ask, {"amount": amount, "from_currency": src, "to_currency": dst}, {"converted": out},
                f"{amount} {src} is {out} {dst}.")
    if name == "get_stock_price":
        sym = pick(r, SYMBOLS, SYMBOLS_HELD_OUT, held_out)
        price = round(r.uniform(10, 900), 2)
        ask = r.choice([f"What is the price of {sym} stock?", f"How much does {sym} trade at?",
                        f"Get me the stock price of {sym}."])
        return ask, {"symbol": sym}, {"price": price}, f"{sym} trades at {price}."
    if name == "send_email":
        who = pick(r, NAMES, NAMES_HELD_OUT, held_out) + "@example.com"
        subject = r.choice(SUBJECTS)
        ask = r.choice([f"Send an email to {who} about {subject}.", f"Email {who} with the subject {subject}."])
        return ask, {"to": who, "subject": subject}, {"sent": True}, f"I sent the email to {who}."
    if name == "read_file":
        path = pick(r, PATHS, PATHS_HELD_OUT, held_out)
        line = r.choice(PHRASES)
        ask = r.choice([f"Show me the contents of {path}.", f"Read the file {path}.", f"What is in {path}?"])
        return ask, {"path": path}, {"content": line}, f"{path} says: {line}."
    if name == "list_directory":
        path = r.choice(DIRS)
        files = r.sample(PATHS, 2)
        ask = r.choice([f"List the files in {path}.", f"What files are in the {path} directory?"])
        return ask, {"path": path}, {"files": files}, f"{path} holds {files[0]} and {files[1]}."
    if name == "translate_text":
        text, lang = r.choice(PHRASES), r.choice(LANGUAGES)
        ask = r.choice([f"Translate \"{text}\" into {lang}.", f"How do you say \"{text}\" in {lang}?"])
        return (ask, {"text": text, "target_language": lang}, {"translation": f"<{lang} of {text}>"},
                f"In {lang}: <{lang} of {text}>.")
    if name == "set_reminder":
        task, tm = r.choice(TASKS), r.choice(TIMES)
        ask = r.choice([f"Remind me to {task} at {tm}.", f"Set a reminder to {task} at {tm}."])
        return ask, {"text": task, "time": tm}, {"ok": True}, f"I will remind you to {task} at {tm}."
    if name == "search_docs":
        topic = r.choice(TOPICS)
        ask = r.choice([f"Look up {topic} in the Python docs.", f"Search the documentation for {topic}."])
        return ask, {"query": topic}, {"summary": f"The {topic} module."}, f"The docs say: The {topic} module."
    raise KeyError(name)


SMALL_TALK = [("Hello!", "Hello! How can I help you today?"),
              ("Who are you?", "I am a small assistant that can call tools."),
              ("Thanks, that is all.", "You are welcome."),
              ("Can you help me?", "Yes. Tell me what you need."),
              ("Good morning.", "Good morning! What can I do for you?")]


def dialog(r, held_out=False):
    names = sorted(TOOLS)
    offered = r.sample(names, r.randint(1, 4))
    roll = r.random()
    system = [{"role": "system", "content": "You are a helpful assistant."}] if r.random() < 0.5 else []
    if roll < 0.7:  # a request one offered tool serves
        name = r.choice(offered)
        ask, args, result, final = request_for(r, name, held_out)
        messages = system + [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(result)},
            {"role": "assistant", "content": final}]
        return {"tools": [tool_schema(n) for n in offered], "messages": messages, "expect_tool": name,
                "expect_arguments": args}
    if roll < 0.85:  # a request for a tool that is not offered: decline
        name = r.choice([n for n in names if n not in offered])
        ask, _, _, _ = request_for(r, name, held_out)
        answer = "I cannot do that with the tools I have."
    else:
        ask, answer = r.choice(SMALL_TALK)
    tools = [tool_schema(n) for n in offered] if r.random() < 0.8 else []
    messages = system + [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
    return {"tools": tools, "messages": messages, "expect_tool": None, "expect_arguments": None}


def dialogs(count, seed, held_out=False):
    r = random.Random(seed * 1000003 + (7 if held_out else 0))
    return [dialog(r, held_out) for _ in range(count)]


def held_out_dialogs(count):
    return dialogs(count, seed=424242, held_out=True)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5
    for d in (held_out_dialogs(n) if "--held-out" in sys.argv else dialogs(n, seed=1)):
        print(json.dumps(d))
