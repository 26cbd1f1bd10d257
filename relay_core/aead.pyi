from typing_extensions import Buffer

KEY_SIZE: int
NONCE_SIZE: int
TAG_SIZE: int

class AeadError(ValueError): ...

def seal(key: Buffer, nonce: Buffer, plaintext: Buffer, associated_data: Buffer = ...) -> bytes: ...
def open_(key: Buffer, nonce: Buffer, sealed: Buffer, associated_data: Buffer = ...) -> bytes: ...
