/// The relay's API description, OpenAPI 3.1, served at ``RelayAPI/openAPIPath`` without a token.
///
/// It names every route ``RelayServer`` answers (a test compares the two), every JSON body with the keys its Codable
/// type writes, and every status the relay answers. Kept here as text so the relay needs no resource bundle.
enum RelayOpenAPI {
    /// The document, JSON.
    static let document = #"""
        {
          "openapi": "3.1.0",
          "info": {
            "title": "Shoal relay",
            "version": "1",
            "description": "A blind store-and-forward endpoint for sealed change sets. Every route but /v1/health\#
         and /openapi.json needs `Authorization: Bearer TOKEN`; a token reaches its own cluster only. Every refusal\#
         has a JSON body (RelayErrorBody). Every answer carries `Shoal-Relay-Boot`, a random id of the relay process,\#
         new at each start: a node that meets one it has not seen reads the relay's heads again."
          },
          "security": [{ "bearer": [] }],
          "paths": {
            "/openapi.json": {
              "get": {
                "operationId": "openAPI",
                "summary": "This description of the relay's API.",
                "security": [],
                "responses": {
                  "200": {
                    "description": "The OpenAPI document.",
                    "content": {
                      "application/json": { "schema": { "type": "object", "required": ["openapi", "paths"] } }
                    }
                  }
                }
              }
            },
            "/v1/health": {
              "get": {
                "operationId": "health",
                "summary": "Whether the relay answers.",
                "security": [],
                "responses": {
                  "200": {
                    "description": "It answers, and so does its storage.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Health" } } }
                  },
                  "503": {
                    "description": "It answers, but its storage does not.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Health" } } }
                  }
                }
              }
            },
            "/v1/heads": {
              "get": {
                "operationId": "heads",
                "summary": "The relay's head per site of the token's cluster.",
                "responses": {
                  "200": {
                    "description": "The heads, and the cluster the token reaches.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayHeads" } } }
                  },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            },
            "/v1/changesets": {
              "post": {
                "operationId": "upload",
                "summary": "Store the ranges the relay lacks.",
                "description": "The body is an envelope list: each sealed change set's length (u32, big-endian),\#
         then its bytes. A range is taken only when it starts at the relay's head for its site; one it holds already\#
         is ignored, one that would leave a gap is counted in `gaps`. A body that is malformed, of another cluster\#
         than the token's, or not authenticated with the epoch's upload key stores nothing.",
                "parameters": [
                  { "$ref": "#/components/parameters/UploadEpoch" },
                  { "$ref": "#/components/parameters/UploadAuth" },
                  { "$ref": "#/components/parameters/Uploader" }
                ],
                "requestBody": {
                  "required": true,
                  "content": {
                    "application/vnd.shoal.changesets": { "schema": { "$ref": "#/components/schemas/EnvelopeList" } }
                  }
                },
                "responses": {
                  "200": {
                    "description": "What the upload did.",
                    "content": {
                      "application/json": { "schema": { "$ref": "#/components/schemas/RelayUploadResult" } }
                    }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "403": {
                    "description": "`bad_upload_auth` (the epoch or the authentication is missing, or does not\#
         check), `no_upload_key` (none registered for the epoch: POST /v1/keys), `epoch_retired` (the cluster's key\#
         moved to a newer epoch: seal with it) or `wrong_cluster` (a change set of another cluster than the\#
         token's). Nothing was stored.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            },
            "/v1/snapshots/{id}": {
              "post": {
                "operationId": "uploadSnapshot",
                "summary": "Store chunks of a snapshot.",
                "description": "A snapshot is a node's whole merged state, a change stream from the empty vector cut\#
         in ranges per site and sealed like any upload; the body is an envelope list, with the same authentication as\#
         POST /v1/changesets. Each site's ranges in the snapshot chain from 0; `heads` answers the snapshot's own.",
                "parameters": [
                  { "$ref": "#/components/parameters/SnapshotID" },
                  { "$ref": "#/components/parameters/UploadEpoch" },
                  { "$ref": "#/components/parameters/UploadAuth" },
                  { "$ref": "#/components/parameters/Uploader" }
                ],
                "requestBody": {
                  "required": true,
                  "content": {
                    "application/vnd.shoal.changesets": { "schema": { "$ref": "#/components/schemas/EnvelopeList" } }
                  }
                },
                "responses": {
                  "200": {
                    "description": "What the upload did.",
                    "content": {
                      "application/json": { "schema": { "$ref": "#/components/schemas/RelayUploadResult" } }
                    }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "403": {
                    "description": "`bad_upload_auth`, `no_upload_key`, `epoch_retired` or `wrong_cluster`, as for POST\#
         /v1/changesets. Nothing was stored.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            },
            "/v1/snapshots/{id}/complete": {
              "post": {
                "operationId": "completeSnapshot",
                "summary": "Make a whole snapshot the cluster's.",
                "description": "The snapshot covers `vector`: every site's ranges in it must run from 0 to the\#
         vector's seq. It then replaces the cluster's earlier snapshot, and the change sets it covers go once the\#
         relay's retention (age, bytes) lets them; a node older than what is kept gets the snapshot and what follows.\#
         Authenticated as uploads are.",
                "parameters": [
                  { "$ref": "#/components/parameters/SnapshotID" },
                  { "$ref": "#/components/parameters/UploadEpoch" },
                  { "$ref": "#/components/parameters/UploadAuth" }
                ],
                "requestBody": {
                  "required": true,
                  "content": {
                    "application/json": { "schema": { "$ref": "#/components/schemas/RelaySnapshotCompletion" } }
                  }
                },
                "responses": {
                  "200": {
                    "description": "The snapshot is the cluster's now.",
                    "content": {
                      "application/json": {
                        "schema": {
                          "type": "object",
                          "required": ["snapshot", "droppedRanges"],
                          "properties": {
                            "snapshot": { "type": "string", "pattern": "^[0-9]+$" },
                            "droppedRanges": { "type": "string", "pattern": "^[0-9]+$" }
                          },
                          "additionalProperties": false
                        }
                      }
                    }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "403": {
                    "description": "`bad_upload_auth`, `no_upload_key` or `epoch_retired`, as for POST /v1/changesets.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "409": {
                    "description": "`snapshot_incomplete`: some of the snapshot is missing; nothing changed.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            },
            "/v1/pull": {
              "post": {
                "operationId": "pull",
                "summary": "The change sets a version vector lacks.",
                "description": "The vector is the whole cursor, so any relay instance answers it after any restart.\#
         With nothing to send, the relay waits up to `waitMilliseconds` for an upload to the cluster (long-poll).",
                "parameters": [{ "$ref": "#/components/parameters/Uploader" }],
                "requestBody": {
                  "required": true,
                  "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayPullRequest" } } }
                },
                "responses": {
                  "200": {
                    "description": "A page: an envelope list, in an order the node can apply (empty when nothing was\#
         found in time).",
                    "headers": {
                      "Shoal-More": {
                        "required": true,
                        "description": "`1` when the relay holds more than the page carried.",
                        "schema": { "type": "string", "enum": ["0", "1"] }
                      }
                    },
                    "content": {
                      "application/vnd.shoal.changesets": { "schema": { "$ref": "#/components/schemas/EnvelopeList" } }
                    }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/BusyOrStorageUnavailable" }
                }
              }
            },
            "/v1/rotate": {
              "post": {
                "operationId": "rotate",
                "summary": "Start a new key epoch: retire the cluster's tokens, add the new one, leave grants for\#
         the members.",
                "requestBody": {
                  "required": true,
                  "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayRotation" } } }
                },
                "responses": {
                  "200": {
                    "description": "The epoch began.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/EpochAnswer" } } }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "409": {
                    "description": "`epoch_taken`: the epoch is not the cluster's newest plus one; `epoch` names the\#
         newest.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            },
            "/v1/keys": {
              "post": {
                "operationId": "registerUploadKey",
                "summary": "Register the key an epoch's uploads are authenticated with (the first one registered\#
         stays).",
                "requestBody": {
                  "required": true,
                  "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayUploadKey" } } }
                },
                "responses": {
                  "200": {
                    "description": "The key is the epoch's (registered now, or the same one before).",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/EpochAnswer" } } }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "403": {
                    "description": "`epoch_retired`: the cluster's key moved to a newer epoch.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "409": {
                    "description": "`key_conflict`: another key is registered for the epoch.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
                  },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            },
            "/v1/grants": {
              "get": {
                "operationId": "grants",
                "summary": "The key grants of epochs after `after`.",
                "description": "A token retired by a rotation may still read them: each grant opens only with its\#
         recipient's key. With none to answer, the relay waits up to `wait` milliseconds for a rotation or new\#
         grants (long-poll).",
                "parameters": [
                  {
                    "name": "after",
                    "in": "query",
                    "description": "Only grants of epochs after this one (0 when missing).",
                    "schema": { "$ref": "#/components/schemas/Epoch" }
                  },
                  {
                    "name": "recipient",
                    "in": "query",
                    "description": "Only the grants for this node id.",
                    "schema": { "type": "string" }
                  },
                  {
                    "name": "wait",
                    "in": "query",
                    "description": "With none to answer, wait up to this many milliseconds (at most 30000; 0 when\#
         missing).",
                    "schema": { "type": "integer", "minimum": 0, "maximum": 30000 }
                  }
                ],
                "responses": {
                  "200": {
                    "description": "The grants, and the cluster's newest epoch.",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayGrants" } } }
                  },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              },
              "post": {
                "operationId": "addGrants",
                "summary": "Add grants for members that joined after a rotation (grants of epochs the cluster has\#
         not reached are left out).",
                "requestBody": {
                  "required": true,
                  "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayGrants" } } }
                },
                "responses": {
                  "200": {
                    "description": "How many grants were stored (those held already are not counted).",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/StoredAnswer" } } }
                  },
                  "400": { "$ref": "#/components/responses/Malformed" },
                  "401": { "$ref": "#/components/responses/Unauthorized" },
                  "413": { "$ref": "#/components/responses/TooLarge" },
                  "429": { "$ref": "#/components/responses/RateLimited" },
                  "500": { "$ref": "#/components/responses/Internal" },
                  "503": { "$ref": "#/components/responses/StorageUnavailable" }
                }
              }
            }
          },
          "components": {
            "securitySchemes": {
              "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A relay token (`shoal relay token create`): `shoal-relay-` and 64 hex digits."
              }
            },
            "parameters": {
              "UploadEpoch": {
                "name": "Shoal-Upload-Epoch",
                "in": "header",
                "required": true,
                "description": "The key epoch the body is authenticated with (and every change set in it sealed with).",
                "schema": { "$ref": "#/components/schemas/Epoch" }
              },
              "UploadAuth": {
                "name": "Shoal-Upload-Auth",
                "in": "header",
                "required": true,
                "description": "HMAC-SHA256 of the body with the epoch's upload key, hex.",
                "schema": { "type": "string", "pattern": "^[0-9a-f]{64}$" }
              },
              "SnapshotID": {
                "name": "id",
                "in": "path",
                "required": true,
                "description": "The snapshot's id, chosen by its uploader: 1 to 2^63 - 1.",
                "schema": { "type": "string", "pattern": "^[0-9]{1,19}$" }
              },
              "Uploader": {
                "name": "Shoal-Uploader",
                "in": "header",
                "description": "A random id of the uploading process (at most 64 bytes; a longer one is ignored). A\#
         pull is not sent back the ranges its own process uploaded.",
                "schema": { "type": "string", "maxLength": 64 }
              }
            },
            "headers": {
              "Retry-After": {
                "required": true,
                "description": "When to try again, in seconds.",
                "schema": { "type": "integer", "minimum": 1 }
              }
            },
            "responses": {
              "Malformed": {
                "description": "`malformed`: the body is not of the documented shape. Nothing was stored.",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              },
              "Unauthorized": {
                "description": "`unauthorized` (no bearer token, or an unknown or revoked one) or `token_rotated`\#
         (retired by a key rotation: the new token is in the member's grant).",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              },
              "TooLarge": {
                "description": "`too_large`: the body, or a change set in it, is over the relay's limit, which\#
         `limit` names in bytes. Nothing was stored.",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              },
              "RateLimited": {
                "description": "`rate_limited`: more requests a second with this token than the relay takes (`limit`).",
                "headers": { "Retry-After": { "$ref": "#/components/headers/Retry-After" } },
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              },
              "Internal": {
                "description": "`internal`: the relay's storage failed; try again later.",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              },
              "StorageUnavailable": {
                "description": "`storage_unavailable`: the relay's storage does not answer; try again after\#
         Retry-After.",
                "headers": { "Retry-After": { "$ref": "#/components/headers/Retry-After" } },
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              },
              "BusyOrStorageUnavailable": {
                "description": "`busy`: the relay holds as many bytes of answers being sent as it allows (`limit`);\#
         try again after Retry-After, or another instance. Or `storage_unavailable`: its storage does not answer.",
                "headers": { "Retry-After": { "$ref": "#/components/headers/Retry-After" } },
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RelayErrorBody" } } }
              }
            },
            "schemas": {
              "Epoch": {
                "description": "A key epoch.",
                "type": "integer",
                "minimum": 0,
                "maximum": 4294967295
              },
              "Sequence": {
                "description": "A site's sequence number.",
                "type": "integer",
                "minimum": 0,
                "maximum": 18446744073709551615
              },
              "SiteID": {
                "description": "A site id: 32 hex digits.",
                "type": "string",
                "pattern": "^[0-9a-f]{32}$"
              },
              "VersionVector": {
                "description": "Site id → sequence number.",
                "type": "object",
                "propertyNames": { "$ref": "#/components/schemas/SiteID" },
                "additionalProperties": { "$ref": "#/components/schemas/Sequence" }
              },
              "EnvelopeList": {
                "description": "Sealed change sets, each its length (u32, big-endian) and its bytes: \"SHRL\"\#
         version:u8 flags:u8 cluster-length:u8 cluster epoch:u32 site:16 from:u64 to:u64 upload:u64 index:u32\#
         sealed-length:u32 sealed.",
                "type": "string",
                "format": "binary"
              },
              "Health": {
                "type": "object",
                "required": ["status", "storage"],
                "properties": {
                  "status": { "enum": ["ok", "storage_down"] },
                  "storage": { "enum": ["ok", "down"] },
                  "error": { "description": "Why the storage counts as down.", "type": "string" }
                },
                "additionalProperties": false
              },
              "RelayHeads": {
                "description": "The relay's head per site: the last sequence number of the last range it holds.",
                "type": "object",
                "required": ["heads"],
                "properties": {
                  "heads": { "$ref": "#/components/schemas/VersionVector" },
                  "cluster": { "description": "The cluster the token reaches.", "type": "string" },
                  "snapshot": { "$ref": "#/components/schemas/RelaySnapshotInfo" },
                  "uncoveredBytes": {
                    "description": "Bytes of change sets the snapshot does not cover (all, without a snapshot).",
                    "type": "integer",
                    "minimum": 0
                  }
                },
                "additionalProperties": false
              },
              "RelaySnapshotInfo": {
                "description": "The cluster's newest complete snapshot.",
                "type": "object",
                "required": ["id", "vector", "bytes", "createdMs"],
                "properties": {
                  "id": { "type": "string", "pattern": "^[0-9]+$" },
                  "vector": { "$ref": "#/components/schemas/VersionVector" },
                  "bytes": { "type": "integer", "minimum": 0 },
                  "createdMs": { "description": "When it was completed, Unix milliseconds.", "type": "integer" }
                },
                "additionalProperties": false
              },
              "RelaySnapshotCompletion": {
                "description": "The version vector a whole snapshot covers.",
                "type": "object",
                "required": ["vector"],
                "properties": { "vector": { "$ref": "#/components/schemas/VersionVector" } },
                "additionalProperties": false
              },
              "RelayUploadResult": {
                "type": "object",
                "required": ["stored", "alreadyHeld", "gaps", "heads"],
                "properties": {
                  "stored": { "description": "Chunks stored now.", "type": "integer", "minimum": 0 },
                  "alreadyHeld": { "description": "Chunks of ranges the relay held already (ignored).", "type":\#
         "integer", "minimum": 0 },
                  "gaps": { "description": "Chunks refused because their range does not start at the relay's head\#
         for their site: cut again from `heads`.", "type": "integer", "minimum": 0 },
                  "heads": { "$ref": "#/components/schemas/VersionVector" }
                },
                "additionalProperties": false
              },
              "RelayPullResume": {
                "description": "Where to carry on inside a range a previous page ended in.",
                "type": "object",
                "required": ["site", "from", "index"],
                "properties": {
                  "site": { "$ref": "#/components/schemas/SiteID" },
                  "from": { "description": "The range's start.", "$ref": "#/components/schemas/Sequence" },
                  "index": { "description": "The first chunk not received yet.", "type": "integer", "minimum": 0,\#
         "maximum": 4294967295 }
                }
              },
              "RelayPullRequest": {
                "type": "object",
                "required": ["vector"],
                "properties": {
                  "vector": { "description": "What the node holds.", "$ref": "#/components/schemas/VersionVector" },
                  "resume": { "type": "array", "items": { "$ref": "#/components/schemas/RelayPullResume" } },
                  "waitMilliseconds": {
                    "description": "With nothing to send, wait up to this long for an upload (at most 30000; 0 when\#
         missing).",
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 30000
                  },
                  "maximumBytes": {
                    "description": "The page's byte budget (at least one chunk is always sent; the relay keeps it\#
         between 64 KiB and its own limit).",
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 9223372036854775807
                  },
                  "snapshotSites": {
                    "description": "Sites to serve from the snapshot first, where it holds more of them than the\#
         vector, then from the change log after it.",
                    "type": "array",
                    "maxItems": 1024,
                    "items": { "$ref": "#/components/schemas/SiteID" }
                  }
                }
              },
              "RelayGrant": {
                "description": "A key grant, sealed to its recipient's key.",
                "type": "object",
                "required": ["epoch", "recipient", "body"],
                "properties": {
                  "epoch": { "$ref": "#/components/schemas/Epoch" },
                  "recipient": { "description": "The recipient's node id (at most 128 bytes of UTF-8).", "type":\#
         "string", "minLength": 1, "maxLength": 128 },
                  "body": { "description": "The sealed grant, base64 (at most 64 KiB).", "type": "string",\#
         "maxLength": 65536 }
                }
              },
              "RelayGrants": {
                "type": "object",
                "required": ["grants"],
                "properties": {
                  "grants": {
                    "type": "array",
                    "maxItems": 10000,
                    "items": { "$ref": "#/components/schemas/RelayGrant" }
                  },
                  "epoch": { "description": "The cluster's newest key epoch (in answers).", "$ref":\#
         "#/components/schemas/Epoch" }
                }
              },
              "RelayRotation": {
                "description": "A new key epoch: the relay's newest plus one.",
                "type": "object",
                "required": ["epoch", "tokenHash", "grants"],
                "properties": {
                  "epoch": { "type": "integer", "minimum": 1, "maximum": 4294967295 },
                  "tokenHash": { "description": "The SHA-256 of the token that replaces the cluster's tokens, hex.",\#
         "type": "string", "pattern": "^[0-9a-f]{64}$" },
                  "grants": {
                    "type": "array",
                    "maxItems": 10000,
                    "items": { "$ref": "#/components/schemas/RelayGrant" }
                  },
                  "uploadKey": { "$ref": "#/components/schemas/UploadKeyBytes" }
                }
              },
              "UploadKeyBytes": {
                "description": "An upload key: 32 bytes, base64.",
                "type": "string",
                "pattern": "^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$"
              },
              "RelayUploadKey": {
                "type": "object",
                "required": ["epoch", "key"],
                "properties": {
                  "epoch": { "$ref": "#/components/schemas/Epoch" },
                  "key": { "$ref": "#/components/schemas/UploadKeyBytes" }
                }
              },
              "EpochAnswer": {
                "type": "object",
                "required": ["epoch"],
                "properties": { "epoch": { "$ref": "#/components/schemas/Epoch" } },
                "additionalProperties": false
              },
              "StoredAnswer": {
                "type": "object",
                "required": ["stored"],
                "properties": { "stored": { "type": "integer", "minimum": 0 } },
                "additionalProperties": false
              },
              "RelayErrorBody": {
                "description": "The body of every refusal.",
                "type": "object",
                "required": ["error", "message"],
                "properties": {
                  "error": {
                    "description": "For programs: unauthorized, token_rotated, wrong_cluster, malformed,\#
         no_upload_key, epoch_retired, bad_upload_auth, key_conflict, too_large, rate_limited, epoch_taken,\#
         snapshot_incomplete, internal, busy or storage_unavailable.",
                    "type": "string"
                  },
                  "message": { "description": "For a person.", "type": "string" },
                  "limit": { "description": "The limit that was exceeded: bytes for too_large, requests a second for\#
         rate_limited, bytes of answers held at once for busy.", "type": "integer" },
                  "retryAfterSeconds": { "description": "When to try again, in seconds (also in Retry-After).",\#
         "type": "integer", "minimum": 1 },
                  "epoch": { "description": "The cluster's newest key epoch (on epoch_taken).", "$ref":\#
         "#/components/schemas/Epoch" }
                },
                "additionalProperties": false
              }
            }
          }
        }
        """#
}
