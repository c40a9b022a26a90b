from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8787/v1")  # the API key: OPENAI_API_KEY, as usual
