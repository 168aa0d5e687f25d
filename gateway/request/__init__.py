"""The request model, and the checks of a request that need nothing but the request.

- `ticket.py`: the `Ticket` a request carries through every stage, its outcome and usage;
- `errors.py`: `ApiError` and the vocabularies of refusals (`ErrorCode`, `RejectionReason`);
- `openai_api.py`: the OpenAI envelope read and validated (content type, size, JSON, fields);
- `media_urls.py`: the media URL policy, what a pool's engines may be asked to fetch (a security check);
- `admin_auth.py`: the admin bearer token every /admin route checks.
"""
